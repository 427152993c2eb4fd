"""The injectors of an experiment's method, each checked (preflight) and planned, before anything is applied."""

from __future__ import annotations

from typing import Any

from chaoskit.errors import PreflightError
from chaoskit.executors import get_executor
from chaoskit.experiment.models import Step
from chaoskit.injectors import Injector, injector_class
from chaoskit.injectors.base import FaultContext
from chaoskit.targets.layer import place
from chaoskit.targets.local import CgroupTarget


def inject_steps(steps: list[Step]) -> list[Step]:
    out: list[Step] = []
    for s in steps:
        if s.inject is not None:
            out.append(s)
        elif s.parallel:
            out.extend(inject_steps(s.parallel))
    return out


UNRESOLVED = "(target resolved at run time: it needs facts of a reference deployment that is not running yet)"


def plan_faults(method: list[Step], unresolved: frozenset[int] = frozenset(), run_id: str = "") -> tuple[
        dict[int, Injector], list[dict[str, Any]], list[str]]:
    """(injector per id(step), the plan, preflight problems). Each fault is placed (targets.layer) and
    checked by its executor. The plan is made even where preflight failed: --dry-run prints it beside the
    reason. Steps in `unresolved` (a dry run's {target.*} not known yet) are listed but neither checked nor
    planned."""
    injectors: dict[int, Injector] = {}
    plan, problems = [], []
    for step in inject_steps(method):
        entry: dict[str, Any] = {"step": step.label(), "duration_s": step.duration}
        if id(step) in unresolved:
            inj = _injector(step, step.inject, run_id)
            entry["changes"] = [UNRESOLVED]
        else:
            inj, problem, passed_over = _choose(step, run_id)
            if problem:
                problems.append(problem)
            entry["changes"] = _lines(inj)
            if passed_over:
                entry["variant"] = inj.type
                entry["passed_over"] = passed_over
                entry["changes"].insert(0, f"variant {inj.type}: " + "; ".join(passed_over))
        injectors[id(step)] = inj
        plan.append({**entry, "type": inj.type})
    return injectors, plan, problems + _shared_cgroups(method, injectors)


def _shared_cgroups(method: list[Step], injectors: dict[int, Injector]) -> list[str]:
    """Two faults of one `parallel` block that set the limits of the same existing cgroup: each restores the
    limit it found, so whichever ends last would put back the other's. Refused before anything is applied."""
    problems = []
    for block in (s for s in method if s.parallel):
        seen: dict[str, str] = {}
        for step in inject_steps(block.parallel or []):
            target = injectors[id(step)].ctx.target
            if isinstance(target, CgroupTarget) and target.cgroup is not None:
                if target.cgroup in seen:
                    problems.append(f"{step.label()}: {seen[target.cgroup]} in the same parallel block already "
                                    f"limits cgroup {target.cgroup}; their reverts would undo each other")
                seen.setdefault(target.cgroup, step.label())
    return problems


def _injector(step: Step, spec: Any, run_id: str) -> Injector:
    return injector_class(spec.type)(spec, FaultContext(step=step.label(), lifetime_s=step.lifetime(), run_id=run_id))


def _choose(step: Step, run_id: str) -> tuple[Injector, str | None, list[str]]:
    """The step's fault, or the first fallback this host can apply: (injector, its preflight problem or None,
    why each fault before it was passed over)."""
    passed_over: list[str] = []
    candidates = [step.inject, *step.fallback]
    for i, spec in enumerate(candidates):
        inj = _injector(step, spec, run_id)
        try:
            place(inj)
            get_executor(inj.ctx.executor).preflight(inj)
            return inj, None, passed_over
        except PreflightError as e:
            if i == len(candidates) - 1:
                return inj, str(e) if not passed_over else "; ".join([*passed_over, str(e)]), passed_over
            passed_over.append(f"{spec.type} cannot run here ({e})")
    raise AssertionError("unreachable")


def _lines(inj: Injector) -> list[str]:
    try:
        return get_executor(inj.ctx.executor).plan(inj)
    except Exception as e:
        return [f"(no plan: {type(e).__name__}: {e})"]
