"""The injectors of an experiment's method, each checked (preflight) and planned, before anything is applied.
A step is known by its path in the experiment (`method[2].parallel[1]`), the same in every run of the file."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from chaoskit.errors import PreflightError
from chaoskit.executors import get_executor
from chaoskit.executors.layer import node_selector, place
from chaoskit.experiment.models import Step
from chaoskit.injectors import Injector, injector_class
from chaoskit.injectors.base import K8S_HELPER, FaultContext
from chaoskit.model.events import PlanStep
from chaoskit.targets.local import CgroupTarget

if TYPE_CHECKING:
    from chaoskit.injectors.forkserver.client import Forkserver


def step_path(parent: str, index: int) -> str:
    return f"{parent}[{index}]"


def inject_steps(steps: list[Step], parent: str = "method") -> list[tuple[str, Step]]:
    """(path, step) of each fault of `steps` (whose own path is `parent`), parallel blocks flattened in order."""
    out: list[tuple[str, Step]] = []
    for i, s in enumerate(steps):
        if s.inject is not None:
            out.append((step_path(parent, i), s))
        elif s.parallel:
            out.extend(inject_steps(s.parallel, f"{step_path(parent, i)}.parallel"))
    return out


def deferred_paths(fields: Iterable[tuple[Any, ...]]) -> frozenset[str]:
    """The paths of the steps that hold the given field paths (the loader's ('method', 2, 'parallel', 1, 'inject',
    'pid') ...): a dry run plans those steps as resolved at run time."""
    out = set()
    for field in fields:
        if field[:1] != ("method",):
            continue
        path, rest = "method", list(field[1:])
        while rest and isinstance(rest[0], int):
            path = step_path(path, rest.pop(0))
            if rest[:1] != ["parallel"]:
                out.add(path)
                break
            path += "." + rest.pop(0)
    return frozenset(out)


UNRESOLVED = "(target resolved at run time: it needs facts of a reference deployment that is not running yet)"


def plan_faults(method: list[Step], unresolved: frozenset[str] = frozenset(), run_id: str = "",
                forkserver: Forkserver | None = None) -> tuple[dict[str, Injector], list[PlanStep], list[str]]:
    """(injector per step path, the plan, preflight problems). Each fault is placed (executors.layer) and
    checked by its executor. The plan is made even where preflight failed: --dry-run prints it beside the
    reason. Steps in `unresolved` (a dry run's {target.*} not known yet) are listed but neither checked nor
    planned. `forkserver`: the run's, for its proxy helpers."""
    run = FaultContext(run_id=run_id, forkserver=forkserver)  # what every fault's context shares
    injectors: dict[str, Injector] = {}
    plan: list[PlanStep] = []
    problems: list[str] = []
    for path, step in inject_steps(method):
        passed_over: list[str] = []
        if path in unresolved:
            inj = _injector(step, step.inject, run)
            changes = [UNRESOLVED]
        else:
            inj, problem, passed_over = _choose(step, run)
            if problem:
                problems.append(problem)
            changes = _lines(inj, problem)
            if passed_over:
                changes.insert(0, f"variant {inj.type}: " + "; ".join(passed_over))
        injectors[path] = inj
        plan.append(PlanStep(step=step.label(), duration_s=step.duration, changes=changes,
                             variant=inj.type if passed_over else None, passed_over=passed_over, type=inj.type,
                             path=path))
    return injectors, plan, problems + _shared_cgroups(method, injectors)


def _shared_cgroups(method: list[Step], injectors: dict[str, Injector]) -> list[str]:
    """Two faults of one `parallel` block that set the limits of the same existing cgroup: each restores the
    limit it found, so whichever ends last would put back the other's. Refused before anything is applied."""
    problems = []
    for i, block in enumerate(method):
        if not block.parallel:
            continue
        seen: dict[str, str] = {}
        for path, step in inject_steps(block.parallel, f"{step_path('method', i)}.parallel"):
            target = injectors[path].ctx.target
            if isinstance(target, CgroupTarget) and target.cgroup is not None:
                if target.cgroup in seen:
                    problems.append(f"{step.label()}: {seen[target.cgroup]} in the same parallel block already "
                                    f"limits cgroup {target.cgroup}; their reverts would undo each other")
                seen.setdefault(target.cgroup, step.label())
    return problems


def _injector(step: Step, spec: Any, run: FaultContext) -> Injector:
    return injector_class(spec.type)(spec, replace(run, step=step.label(), lifetime_s=step.lifetime()))


def _choose(step: Step, run: FaultContext) -> tuple[Injector, str | None, list[str]]:
    """The step's fault, or the first fallback this host can apply: (injector, its preflight problem or None,
    why each fault before it was passed over)."""
    passed_over: list[str] = []
    candidates = [step.inject, *step.fallback]
    for i, spec in enumerate(candidates):
        inj = _injector(step, spec, run)
        try:
            place(inj)
            get_executor(inj.ctx.executor).preflight(inj)
            return inj, None, passed_over
        except PreflightError as e:
            if i == len(candidates) - 1:
                return inj, str(e) if not passed_over else "; ".join([*passed_over, str(e)]), passed_over
            passed_over.append(f"{spec.type} cannot run here ({e})")
    raise AssertionError("unreachable")


def _lines(inj: Injector, problem: str | None = None) -> list[str]:
    """The executor's plan of the fault; where there is none, why: a `kubernetes:` fault whose pods could not be
    chosen (no cluster, no such pods) has no plan, and says the preflight reason rather than what its local
    code makes of a target it cannot reach."""
    if problem and node_selector(inj) is not None and inj.ctx.executor != K8S_HELPER:
        return [f"(no plan: the pods could not be chosen: {problem})"]
    try:
        return get_executor(inj.ctx.executor).plan(inj)
    except Exception as e:
        return [f"(no plan: {problem})" if problem else f"(no plan: {type(e).__name__}: {e})"]
