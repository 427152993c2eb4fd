"""Tolerances: `< 950`, `>= 0.99`, `100..200`, `== 0`, `~ regex`, plain equality; and `metric op value` rules."""

from __future__ import annotations

import math
import operator
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

_OPS: dict[str, Callable[[Any, Any], bool]] = {
    "<=": operator.le, ">=": operator.ge, "==": operator.eq, "!=": operator.ne,
    "<": operator.lt, ">": operator.gt,
}
_CMP_RE = re.compile(r"^\s*(<=|>=|==|!=|<|>)\s*(.+?)\s*$")
_RANGE_RE = re.compile(r"^\s*(-?\d+(?:\.\d+)?)\s*\.\.\s*(-?\d+(?:\.\d+)?)\s*$")
_REGEX_RE = re.compile(r"^\s*~\s*(.+?)\s*$")
_RULE_RE = re.compile(r"^\s*([A-Za-z_][\w.\-]*)\s*(<=|>=|==|!=|<|>|~)\s*(.+?)\s*$")


def _number(value: Any) -> float | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, str):
        try:
            return float(value.strip())
        except ValueError:
            return None
    return None


@dataclass(frozen=True)
class Tolerance:
    """One expectation on a measured value; `check` returns (ok, explanation)."""

    kind: str  # "cmp" | "range" | "regex" | "eq"
    op: str = "=="
    value: Any = None
    low: float = 0.0
    high: float = 0.0

    def __str__(self) -> str:
        if self.kind == "range":
            return f"{self.low:g}..{self.high:g}"
        if self.kind == "regex":
            return f"~ {self.value}"
        if self.kind == "cmp":
            return f"{self.op} {self.value:g}" if isinstance(self.value, float) else f"{self.op} {self.value}"
        return f"== {self.value!r}"

    def check(self, actual: Any) -> tuple[bool, str]:
        if self.kind == "regex":
            ok = actual is not None and re.search(self.value, str(actual)) is not None
            return ok, f"{actual!r} {'matches' if ok else 'does not match'} /{self.value}/"
        if self.kind == "eq":
            ok = actual == self.value or (
                _number(actual) is not None and _number(self.value) is not None
                and _number(actual) == _number(self.value)
            ) or (isinstance(self.value, str) and str(actual) == self.value)
            return ok, f"{actual!r} {'==' if ok else '!='} {self.value!r}"
        num = _number(actual)
        if num is None or math.isnan(num):
            return False, f"{actual!r} is not a number (expected {self})"
        if self.kind == "range":
            ok = self.low <= num <= self.high
            return ok, f"{num:g} {'in' if ok else 'not in'} {self.low:g}..{self.high:g}"
        if isinstance(self.value, float):
            ok = _OPS[self.op](num, self.value)
            return ok, f"{num:g} {self.op} {self.value:g}" + ("" if ok else " is false")
        ok = _OPS[self.op](str(actual), str(self.value))
        return ok, f"{actual!r} {self.op} {self.value!r}" + ("" if ok else " is false")


def parse_tolerance(spec: Any) -> Tolerance:
    """Build a Tolerance from YAML; ValueError with a readable message on nonsense."""
    if isinstance(spec, Tolerance):
        return spec
    if isinstance(spec, list):
        if len(spec) == 2 and all(_number(v) is not None for v in spec):
            low, high = float(spec[0]), float(spec[1])
            if low > high:
                raise ValueError(f"range [{low:g}, {high:g}] is empty (low > high)")
            return Tolerance("range", low=low, high=high)
        raise ValueError("a list tolerance must be [low, high] numbers")
    if isinstance(spec, dict):
        raise ValueError("expected a tolerance like '< 950', '>= 0.99', '100..200' or a value")
    if isinstance(spec, str):
        if m := _RANGE_RE.match(spec):
            low, high = float(m.group(1)), float(m.group(2))
            if low > high:
                raise ValueError(f"range '{spec}' is empty (low > high)")
            return Tolerance("range", low=low, high=high)
        if m := _REGEX_RE.match(spec):
            try:
                re.compile(m.group(1))
            except re.error as e:
                raise ValueError(f"bad regular expression '{m.group(1)}': {e}") from None
            return Tolerance("regex", value=m.group(1))
        if m := _CMP_RE.match(spec):
            num = _number(m.group(2))
            if num is None and m.group(1) not in ("==", "!="):
                raise ValueError(f"'{spec}': comparison needs a number after '{m.group(1)}'")
            return Tolerance("cmp", op=m.group(1), value=num if num is not None else m.group(2))
    return Tolerance("eq", value=spec)


@dataclass(frozen=True)
class Rule:
    """`metric op value` — e.g. a safeguard's `error_rate > 0.5`."""

    metric: str
    tolerance: Tolerance

    def __str__(self) -> str:
        return f"{self.metric} {self.tolerance}"

    def matches(self, measurements: dict[str, Any]) -> tuple[bool, str]:
        if self.metric not in measurements:
            return False, f"{self.metric} not measured"
        ok, why = self.tolerance.check(measurements[self.metric])
        return ok, f"{self.metric}: {why}"


def parse_rule(text: Any) -> Rule:
    if not isinstance(text, str) or not (m := _RULE_RE.match(text)):
        raise ValueError(f"expected a rule like 'error_rate > 0.5' (got {text!r})")
    metric, op, value = m.groups()
    return Rule(metric, parse_tolerance(f"~ {value}" if op == "~" else f"{op} {value}"))
