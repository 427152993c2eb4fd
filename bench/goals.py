"""A benchmark's goals and its last line, shared by bench/*.py (stdlib only: gpu_check.py runs on bare machines).

A bench states its goals once, at its top, each on a key of its RESULT line:

    GOALS = Goals(Goal("watchdog_ms", "<=", 100, "watchdog revert after a SIGKILL of the run"))

and ends with `return GOALS.result(keys)`: it prints one line per goal (measured, limit, met or NOT met), then
`RESULT k=v ... goal_met=True|False` (with `missed=key,...` naming the goals missed, `unjudged=key,...` those the
run did not measure: a part left out) and returns the exit code, 0 when every measured goal is met (and at least
one was measured), else 1. A value that is nan is a miss: what was not measured cannot be met.

A goal's limit can be set for one run, to see a bench go red or green without editing it: `--goal key=value`
(repeatable; taken out of sys.argv before the bench reads its own arguments) or `BENCH_GOALS="key=value ..."` in
the environment (the flag wins). A key that is no goal of the bench is an error (exit 2), so a typo cannot leave
a run judged on its defaults.
"""

from __future__ import annotations

import math
import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


@dataclass
class Goal:
    key: str  # the RESULT key (or a value given to result() by name) it judges
    op: str  # "<=" or ">="
    limit: float
    what: str = ""

    def met(self, value: float) -> bool:
        if math.isnan(value):
            return False
        return value <= self.limit if self.op == "<=" else value >= self.limit


class Goals:
    def __init__(self, *goals: Goal, argv: list[str] | None = None, env: Mapping[str, str] | None = None):
        for g in goals:
            if g.op not in ("<=", ">="):
                raise ValueError(f"goal {g.key}: op {g.op!r} is not <= or >=")
        self.goals = {g.key: g for g in goals}
        for key, value in overrides(sys.argv if argv is None else argv, os.environ if env is None else env):
            if key not in self.goals:
                usage(f"--goal {key}: not a goal of this bench (its goals: {', '.join(self.goals) or 'none'})")
            self.goals[key].limit = value

    def judge(self, values: Mapping[str, Any]) -> tuple[list[str], list[str]]:
        """(missed, unjudged) goal keys, printing one line per goal."""
        missed, unjudged = [], []
        for g in self.goals.values():
            if g.key not in values:
                unjudged.append(g.key)
                print(f"goal {g.key} {g.op} {g.limit:g}: not measured in this run")
                continue
            value = number(values[g.key])
            ok = g.met(value)
            print(f"goal {g.key} {g.op} {g.limit:g} ({g.what}): {value:g}, {'met' if ok else 'NOT met'}")
            if not ok:
                missed.append(g.key)
        return missed, unjudged

    def result(self, keys: Mapping[str, Any], **judged: Any) -> int:
        """Print the goals and the RESULT line (`keys` as given, then goal_met, missed, unjudged); return 0 or 1.
        `judged` are values a goal reads that the line does not show as such (e.g. |share - asked|). A run that
        judged no goal at all (every part left out) is not met: nothing was shown to be."""
        missed, unjudged = self.judge({**keys, **judged})
        met = not missed and len(unjudged) < len(self.goals)
        line = " ".join(f"{k}={v}" for k, v in keys.items())
        line += f" goal_met={met}"
        if missed:
            line += f" missed={','.join(missed)}"
        if unjudged:
            line += f" unjudged={','.join(unjudged)}"
        print(f"RESULT {line}", flush=True)
        return 0 if met else 1


def number(v: Any) -> float:
    """A RESULT value as a number: True/False (or their text) as 1/0, what is no number as nan."""
    if isinstance(v, str) and v in ("True", "False"):
        return float(v == "True")
    try:
        return float(v)
    except (TypeError, ValueError):
        return float("nan")


def overrides(argv: list[str], env: Mapping[str, str]) -> list[tuple[str, float]]:
    """The limits set for this run: BENCH_GOALS's, then each `--goal key=value` / `--goal=key=value` of argv
    (removed from it)."""
    items = env.get("BENCH_GOALS", "").replace(",", " ").split()
    rest, i = [argv[0]] if argv else [], 1
    while i < len(argv):
        a = argv[i]
        if a == "--goal":
            if i + 1 == len(argv):
                usage("--goal: expected key=number after it")
            items.append(argv[i + 1])
            i += 2
            continue
        if a.startswith("--goal="):
            items.append(a.removeprefix("--goal="))
        else:
            rest.append(a)
        i += 1
    argv[:] = rest
    out = []
    for item in items:
        key, sep, value = item.partition("=")
        try:
            out.append((key, float(value)))
        except ValueError:
            sep = ""
        if not sep:
            usage(f"--goal {item!r}: expected key=number")
    return out


def usage(message: str) -> None:
    print(message, file=sys.stderr)
    raise SystemExit(2)
