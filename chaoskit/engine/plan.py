"""The injectors of an experiment's method, each checked (preflight) and planned, before anything is applied."""

from __future__ import annotations

from typing import Any

from chaoskit.errors import PreflightError
from chaoskit.injectors import Injector, injector_class
from chaoskit.spec.models import Step


def inject_steps(steps: list[Step]) -> list[Step]:
    out: list[Step] = []
    for s in steps:
        if s.inject is not None:
            out.append(s)
        elif s.parallel:
            out.extend(inject_steps(s.parallel))
    return out


UNRESOLVED = "(planned at run time: its target comes from the deployment the run starts)"


def plan_faults(method: list[Step], unresolved: frozenset[int] = frozenset()) -> tuple[
        dict[int, Injector], list[dict[str, Any]], list[str]]:
    """(injector per id(step), the plan, preflight problems). The plan is made even where preflight failed:
    --dry-run prints it beside the reason. Steps in `unresolved` (a dry run's {target.*} not known yet) are
    listed but neither checked nor planned."""
    injectors: dict[int, Injector] = {}
    plan, problems = [], []
    for step in inject_steps(method):
        inj = injector_class(step.inject.type)(step.inject)  # type: ignore[union-attr]
        if hasattr(inj, "max_lifetime_s"):
            inj.max_lifetime_s = step.lifetime()  # helper processes also expire by themselves
        injectors[id(step)] = inj
        if id(step) in unresolved:
            plan.append({"step": step.label(), "type": inj.type, "duration_s": step.duration, "changes": [UNRESOLVED]})
            continue
        try:
            inj.preflight()
        except PreflightError as e:
            problems.append(str(e))
        try:
            lines = inj.plan()
        except Exception as e:
            lines = [f"(no plan: {type(e).__name__}: {e})"]
        plan.append({"step": step.label(), "type": inj.type, "duration_s": step.duration, "changes": lines})
    return injectors, plan, problems
