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


# Boundaries: every operator at, just below and just above its bound (a `<` written as `<=` must fail here).
@pytest.mark.parametrize("op, below, at, above", [
    ("<", True, False, False), ("<=", True, True, False), (">", False, False, True), (">=", False, True, True),
    ("==", False, True, False), ("!=", True, False, True),
])
@pytest.mark.parametrize("bound", [950, 0.99, 0, -5])
def test_every_operator_at_its_boundary(op, below, at, above, bound):
    tol = parse_tolerance(f"{op} {bound}")
    eps = 1e-9 if isinstance(bound, float) else 1
    assert tol.check(bound - eps)[0] is below
    assert tol.check(bound)[0] is at
    assert tol.check(bound + eps)[0] is above
    rule = parse_rule(f"m {op} {bound}")  # safeguard rules share the operators
    assert [rule.matches({"m": v})[0] for v in (bound - eps, bound, bound + eps)] == [below, at, above]


@pytest.mark.parametrize("spec", ["100..200", [100, 200], "100 .. 200"])
def test_ranges_include_both_ends(spec):
    tol = parse_tolerance(spec)
    assert [tol.check(v)[0] for v in (99.999, 100, 150, 200, 200.001)] == [False, True, True, True, False]


def test_negative_and_degenerate_ranges():
    assert [parse_tolerance("-5..-1").check(v)[0] for v in (-5.001, -5, -1, -0.999)] == [False, True, True, False]
    assert [parse_tolerance("3..3").check(v)[0] for v in (2.999, 3, 3.001)] == [False, True, False]


def test_nan_and_booleans_are_not_numbers():
    assert not parse_tolerance("< 1").check(float("nan"))[0]
    assert not parse_tolerance("0..1").check(True)[0]
