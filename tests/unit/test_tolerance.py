import pytest

from chaoskit.engine.tolerance import parse_rule, parse_tolerance


@pytest.mark.parametrize("spec,value,ok", [
    ("< 950", 900, True), ("< 950", "951.5", False), (">= 0.99", 0.99, True), ("> 1", 1, False),
    ("== 0", 0, True), ("!= 0", 0, False), ("100..200", 150, True), ("100..200", 201, False),
    ([1, 2], 1.5, True), ("~ ^ok", "okay", True), ("~ ^ok", "not ok", False), (200, "200", True),
    (200, 404, False), (True, True, True), ("held", "held", True), ("< 950", "n/a", False),
    ("< 950", None, False),
])
def test_check(spec, value, ok):
    assert parse_tolerance(spec).check(value)[0] is ok


@pytest.mark.parametrize("bad", ["< abc", "5..1", "~ (", [3, 1], {"a": 1}, [1, 2, 3]])
def test_bad_tolerances(bad):
    with pytest.raises(ValueError):
        parse_tolerance(bad)


def test_rule():
    rule = parse_rule("error_rate > 0.5")
    assert rule.matches({"error_rate": 0.6})[0]
    assert not rule.matches({"error_rate": 0.4})[0]
    assert not rule.matches({})[0]
    assert str(rule) == "error_rate > 0.5"
    with pytest.raises(ValueError):
        parse_rule("error_rate >")
