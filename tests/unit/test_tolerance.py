import re

import pytest

from chaoskit.model.tolerance import parse_rule, parse_tolerance


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


# Baseline-relative tolerances: `baseline` is the same probe's same value in the before phase.
@pytest.mark.parametrize("spec, scale, offset", [
    ("< 3x baseline", 3, 0), ("<= baseline + 0.01", 1, 0.01), ("< baseline * 1.5 + 20", 1.5, 20),
    ("> 0.5x baseline", 0.5, 0), ("< 3 x baseline", 3, 0), ("< 3xbaseline", 3, 0), ("<= 2 * baseline - 5", 2, -5),
    ("< 20 + baseline * 1.5", 1.5, 20), (">= -baseline", -1, 0), ("== baseline", 1, 0), ("< 2x baseline + 1e3", 2, 1000),
    ("< 3X Baseline", 3, 0), ("< 2 * 3x baseline", 6, 0),
])
def test_baseline_expressions_parse(spec, scale, offset):
    tol = parse_tolerance(spec)
    assert tol.relative and tol.kind == "baseline"
    assert (tol.value.scale, tol.value.offset) == pytest.approx((scale, offset))
    assert str(tol) == " ".join(spec.split())  # shown as written


@pytest.mark.parametrize("op, below, at, above", [
    ("<", True, False, False), ("<=", True, True, False), (">", False, False, True), (">=", False, True, True),
    ("==", False, True, False), ("!=", True, False, True),
])
def test_baseline_boundaries(op, below, at, above):
    tol = parse_tolerance(f"{op} 3x baseline")
    base = 120.5  # 3x = 361.5 exactly in binary floating point
    assert [tol.check(v, base)[0] for v in (361.5 - 1e-9, 361.5, 361.5 + 1e-9)] == [below, at, above]


def test_baseline_explanations_show_the_arithmetic():
    assert parse_tolerance("< 3x baseline").check(412, 120.5) == \
        (False, "412 < 3x baseline (3 x 120.5 = 361.5) is false")
    assert parse_tolerance("< baseline * 1.5 + 20").check(200, 120.5) == \
        (True, "200 < baseline * 1.5 + 20 (120.5 * 1.5 + 20 = 200.75)")
    assert parse_tolerance("<= baseline").check(130, 120.5) == (False, "130 <= baseline (120.5) is false")
    assert parse_tolerance("> baseline - 5").check(1, 2)[1] == "1 > baseline - 5 (2 - 5 = -3)"
    ok, why = parse_tolerance("< 3x baseline").check(1)  # no baseline given: never passes
    assert not ok and "no baseline" in why
    assert not parse_tolerance("< 3x baseline").check("n/a", 1)[0]
    assert not parse_tolerance("< 3x baseline").check(float("nan"), 1)[0]


@pytest.mark.parametrize("bad, says", [
    ("< 3x", "needs a number"), ("< baseline * baseline", "multiplied by numbers"),
    ("< baseline - baseline", "does not depend on baseline"), ("< 0x baseline", "does not depend on baseline"),
    ("< 3 * 4", "needs a number"), ("< basline", "needs a number"), ("< 3x baseline +", "ends too early"),
    ("< baseline / 2", "unexpected '/ 2'"), ("< (baseline)", "unexpected"), ("< 3y baseline", "unexpected"),
    ("< baseline baseline", "after a complete expression"), ("< x baseline", "expected a number"),
    ("< 3x 4 + baseline", "followed by baseline"), ("< __import__('os') baseline", "unexpected"),
    ("0.5x baseline..2x baseline", "after a comparison"), ("baseline", "after a comparison"),
    ("< 2 ** baseline", "expected a number"), ("< 1e999 * baseline", "overflows"),
])
def test_bad_baseline_expressions(bad, says):
    with pytest.raises(ValueError, match=re.escape(says)):
        parse_tolerance(bad)


def test_the_literal_word_baseline_is_still_matchable():
    assert parse_tolerance("~ ^baseline$").check("baseline")[0]


def test_safeguard_rules_refuse_baseline_and_accept_group_keys():
    with pytest.raises(ValueError, match="safeguard rules compare with fixed numbers"):
        parse_rule("p99_ms > 3x baseline")
    rule = parse_rule("error_rate[triton-0] > 0.5")
    assert rule.metric == "error_rate[triton-0]"
    assert rule.matches({"error_rate[triton-0]": 0.6})[0] and not rule.matches({"error_rate": 0.6})[0]
