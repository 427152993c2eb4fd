"""Tolerances: `< 950`, `>= 0.99`, `100..200`, `== 0`, `~ regex`, plain equality, comparisons with the measured
baseline (`< 3x baseline`, `<= baseline + 0.01`); and `metric op value` rules (fixed numbers only)."""

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
_RULE_RE = re.compile(r"^\s*([A-Za-z_][\w.\-]*(?:\[[^\[\]]+\])?)\s*(<=|>=|==|!=|<|>|~)\s*(.+?)\s*$")
_MENTIONS_BASELINE = re.compile(r"baseline", re.IGNORECASE)
_EXPR_TOKEN = re.compile(r"\s*(?:(?P<num>\d+(?:\.\d+)?(?:[eE][-+]?\d+)?|\.\d+)|(?P<word>baseline)|(?P<x>x)|(?P<op>[-+*]))",
                         re.IGNORECASE)


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
class BaselineExpr:
    """`a * baseline + b`, parsed from a tiny grammar (no eval):
        expr   := term (('+' | '-') term)*
        term   := factor ('*' factor)*           at most one factor of a term may hold baseline
        factor := '-' factor | NUMBER 'x' 'baseline' | NUMBER | 'baseline'
    `3x baseline` is 3 * baseline. The expression must depend on baseline."""

    text: str
    tokens: tuple[tuple[str, str], ...]  # (kind, text): num, word, x, op
    scale: float
    offset: float

    def resolve(self, baseline: float) -> tuple[float, str]:
        """The threshold for this baseline, and the arithmetic that gives it, e.g. (361.5, '3 x 120.5 = 361.5')."""
        value = self.scale * baseline + self.offset
        shown, glue = "", False  # a unary minus sticks to what follows it
        for i, (kind, text) in enumerate(self.tokens):
            shown += ("" if glue or not shown else " ") + (f"{baseline:g}" if kind == "word" else text)
            glue = kind == "op" and text == "-" and (i == 0 or self.tokens[i - 1][0] == "op")
        return value, shown if shown == f"{value:g}" else f"{shown} = {value:g}"


def parse_baseline(text: str) -> BaselineExpr:
    """ValueError naming what is wrong; the caller adds the tolerance it came from."""
    tokens: list[tuple[str, str]] = []
    pos, src = 0, text.strip()
    while pos < len(src):
        m = _EXPR_TOKEN.match(src, pos)
        if m is None or m.end() == pos:
            raise ValueError(f"unexpected '{src[pos:].strip()}' (use numbers, baseline, Nx baseline, + - *)")
        kind = m.lastgroup or ""
        tokens.append((kind, m.group(kind).lower() if kind in ("word", "x") else m.group(kind)))
        pos = m.end()
        if src[pos:].strip() == "":
            break
    it = _Tokens(tokens)
    scale, offset = it.expr()
    if it.peek() is not None:
        raise ValueError(f"unexpected '{it.peek()[1]}' after a complete expression")  # type: ignore[index]
    if not any(k == "word" for k, _ in tokens):
        raise ValueError("arithmetic is only for baseline expressions; write the number itself")
    if scale == 0:
        raise ValueError("the expression does not depend on baseline (its baseline terms cancel out)")
    if not math.isfinite(scale) or not math.isfinite(offset):
        raise ValueError("the expression overflows")
    return BaselineExpr(" ".join(src.split()), tuple(tokens), scale, offset)


class _Tokens:
    """Recursive descent over the tokens; each node is (scale, offset) plus whether baseline appears in it."""

    def __init__(self, tokens: list[tuple[str, str]]):
        self.tokens, self.i = tokens, 0

    def peek(self) -> tuple[str, str] | None:
        return self.tokens[self.i] if self.i < len(self.tokens) else None

    def take(self) -> tuple[str, str]:
        tok = self.peek()
        if tok is None:
            raise ValueError("the expression ends too early")
        self.i += 1
        return tok

    def expr(self) -> tuple[float, float]:
        scale, offset, _ = self.term()
        while (tok := self.peek()) is not None and tok[1] in ("+", "-"):
            self.take()
            s, o, _ = self.term()
            sign = 1.0 if tok[1] == "+" else -1.0
            scale, offset = scale + sign * s, offset + sign * o
        return scale, offset

    def term(self) -> tuple[float, float, bool]:
        scale, offset, has = self.factor()
        while (tok := self.peek()) is not None and tok[1] == "*":
            self.take()
            s, o, h = self.factor()
            if has and h:
                raise ValueError("baseline can only be multiplied by numbers")
            scale, offset, has = (s * offset, o * offset, True) if h else (scale * o, offset * o, has)
        return scale, offset, has

    def factor(self) -> tuple[float, float, bool]:
        kind, text = self.take()
        if kind == "op" and text == "-":
            s, o, h = self.factor()
            return -s, -o, h
        if kind == "word":
            return 1.0, 0.0, True
        if kind == "num":
            nxt = self.peek()
            if nxt is not None and nxt[0] == "x":
                self.take()
                if self.peek() is None or self.take()[0] != "word":
                    raise ValueError(f"'{text}x' must be followed by baseline ('{text}x baseline')")
                return float(text), 0.0, True
            return 0.0, float(text), False
        raise ValueError(f"expected a number or baseline, got '{text}'")


@dataclass(frozen=True)
class Tolerance:
    """One expectation on a measured value; `check` returns (ok, explanation)."""

    kind: str  # "cmp" | "range" | "regex" | "eq" | "baseline" (value is a BaselineExpr)
    op: str = "=="
    value: Any = None
    low: float = 0.0
    high: float = 0.0

    @property
    def relative(self) -> bool:
        """Compares with the measured baseline (this probe's same value in the before phase)."""
        return self.kind == "baseline"

    def __str__(self) -> str:
        if self.kind == "baseline":
            return f"{self.op} {self.value.text}"
        if self.kind == "range":
            return f"{self.low:g}..{self.high:g}"
        if self.kind == "regex":
            return f"~ {self.value}"
        if self.kind == "cmp":
            return f"{self.op} {self.value:g}" if isinstance(self.value, float) else f"{self.op} {self.value}"
        return f"== {self.value!r}"

    def to_json(self) -> dict[str, Any]:
        """As the journal's `experiment` event holds it (from_json reads it back)."""
        out: dict[str, Any] = {"kind": self.kind, "op": self.op, "text": str(self)}
        if self.kind == "range":
            out.update(low=self.low, high=self.high)
        elif self.kind == "baseline":
            out.update(expr=self.value.text, scale=self.value.scale, offset=self.value.offset)
        elif self.kind in ("cmp", "eq") and isinstance(self.value, (int, float)) and not isinstance(self.value, bool):
            out.update(value=float(self.value))
        else:
            out.update(value=str(self.value))
        return out

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Tolerance:
        kind, op = str(data.get("kind", "eq")), str(data.get("op", "=="))
        if kind == "range":
            return cls("range", low=float(data["low"]), high=float(data["high"]))
        if kind == "baseline":
            return cls("baseline", op=op, value=parse_baseline(str(data["expr"])))
        return cls(kind, op=op, value=data.get("value"))

    def check(self, actual: Any, baseline: float | None = None) -> tuple[bool, str]:
        """(ok, explanation). A baseline tolerance needs `baseline`: the value this key had in the before phase."""
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
        if self.kind == "baseline":
            if baseline is None:
                return False, f"{num:g} {self}: no baseline to compare with"
            threshold, shown = self.value.resolve(baseline)
            ok = _OPS[self.op](num, threshold)
            return ok, f"{num:g} {self} ({shown})" + ("" if ok else " is false")
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
        if not _REGEX_RE.match(spec) and _MENTIONS_BASELINE.search(spec):
            return _baseline_tolerance(spec)
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
                raise ValueError(f"'{spec}': comparison needs a number after '{m.group(1)}' "
                                 "(or a baseline expression such as '< 3x baseline')")
            return Tolerance("cmp", op=m.group(1), value=num if num is not None else m.group(2))
    return Tolerance("eq", value=spec)


def _baseline_tolerance(spec: str) -> Tolerance:
    m = _CMP_RE.match(spec)
    if m is None:
        raise ValueError(f"'{spec}': baseline goes after a comparison (< <= > >= == !=), e.g. '< 3x baseline'; "
                         "to match the literal text use a regex such as '~ ^baseline$'")
    try:
        return Tolerance("baseline", op=m.group(1), value=parse_baseline(m.group(2)))
    except ValueError as e:
        raise ValueError(f"'{spec}': {e}") from None


@dataclass(frozen=True)
class Rule:
    """`metric op value` — e.g. a safeguard's `error_rate > 0.5`."""

    metric: str
    tolerance: Tolerance

    def __str__(self) -> str:
        return f"{self.metric} {self.tolerance}"

    def to_json(self) -> dict[str, Any]:
        """As the journal's `experiment` event holds a safeguard's rule."""
        tol = self.tolerance
        value = float(tol.value) if tol.kind == "cmp" and isinstance(tol.value, float) else None
        return {"metric": self.metric, "op": tol.op, "value": value, "text": str(self)}

    def matches(self, measurements: dict[str, Any]) -> tuple[bool, str]:
        if self.metric not in measurements:
            return False, f"{self.metric} not measured"
        ok, why = self.tolerance.check(measurements[self.metric])
        return ok, f"{self.metric}: {why}"


def parse_rule(text: Any) -> Rule:
    if not isinstance(text, str) or not (m := _RULE_RE.match(text)):
        raise ValueError(f"expected a rule like 'error_rate > 0.5' (got {text!r})")
    metric, op, value = m.groups()
    tol = parse_tolerance(f"~ {value}" if op == "~" else f"{op} {value}")
    if tol.relative:
        raise ValueError(f"'{text}': safeguard rules compare with fixed numbers; 'baseline' works only in "
                         "steady-state expect tolerances")
    return Rule(metric, tol)
