"""process.cpu_throttle: cap the CPU time of target processes (cgroup v2 cpu.max / v1 CFS quota);
host.cpu_stress: busy worker processes that take CPU from everything else (a helper process; revert = it exits)."""

from __future__ import annotations

import os
import re
import signal
import time
import uuid
from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal

from pydantic import BeforeValidator, Field, WithJsonSchema, model_validator

from chaoskit.errors import PreflightError
from chaoskit.injectors import helper_proc
from chaoskit.injectors.base import CGROUP_HELPER, NODE_EXECUTORS, FaultContext, Injector, NodeHelper
from chaoskit.injectors.cgroup_move import (
    CgroupHierarchy,
    CgroupRecord,
    any_target_inside,
    cgroup_target,
    move_back_and_remove,
    move_in,
    target_procs,
    target_refs,
)
from chaoskit.injectors.process.fault import CgroupTargets, check_cgroup_target, check_targets
from chaoskit.model.types import Duration, StrictModel
from chaoskit.targets.cgroups import CpuHierarchy, find_cpu_hierarchy
from chaoskit.targets.local import CgroupTarget
from chaoskit.targets.process import ProcessRef, find_by_token, is_alive, parent_pid

MAX_CPUS = 1024
MIN_QUOTA_US = 1000  # the kernel refuses a CFS quota under 1 ms
RMDIR_WAIT_S = 2.0


def parse_share(value: object) -> float:
    """A share as a float: 0.2, '0.2' or '20%' -> 0.2; '150%' -> 1.5. Range checks are the field's."""
    if isinstance(value, bool):
        raise ValueError("expected a number like 0.2 or a percentage like '20%'")
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, str):
        text = value.strip()
        if m := re.fullmatch(r"(\d+(?:\.\d+)?)\s*%", text):
            return float(m.group(1)) / 100.0
        if re.fullmatch(r"\d+(?:\.\d+)?", text):
            return float(text)
    raise ValueError(f"expected a number like 0.2 or a percentage like '20%' (got {value!r})")


Share = Annotated[
    float,
    BeforeValidator(parse_share),
    WithJsonSchema({"type": ["string", "number"], "pattern": r"^\d+(\.\d+)?%?$",
                    "description": "a share like 0.2 or '20%'"}),
]


def host_cpus() -> int:
    return len(os.sched_getaffinity(0))


# ---------------------------------------------------------------- process.cpu_throttle

class CpuThrottleSpec(CgroupTargets):
    type: Literal["process.cpu_throttle"]
    cpu: Share = Field(gt=0, le=MAX_CPUS, description="CPU time allowed, in CPUs: 0.2 or '20%' = a fifth of one "
                                                      "CPU, 1.5 = one and a half")
    period: Duration = Field(0.1, description="CFS period the quota is enforced over, 1ms..1s (default 100ms)")
    @model_validator(mode="after")
    def _check(self) -> CpuThrottleSpec:
        if not 0.001 <= self.period <= 1.0:
            raise ValueError(f"period must be between 1ms and 1s (got {self.period * 1e3:g}ms)")
        if self.quota_us() < MIN_QUOTA_US:
            raise ValueError(f"cpu x period is {self.quota_us()}us of CPU time per period; the kernel needs at "
                             f"least {MIN_QUOTA_US}us (raise cpu or period)")
        return self

    def period_us(self) -> int:
        return round(self.period * 1e6)

    def quota_us(self) -> int:
        return round(self.cpu * self.period * 1e6)


def _limit_text(hier: CpuHierarchy, quota: int | None, period: int) -> str:
    if hier.version == 2:
        return f"cpu.max = '{'max' if quota is None else quota} {period}'"
    return f"cpu.cfs_period_us = {period}, cpu.cfs_quota_us = {-1 if quota is None else quota}"


class CpuThrottleRecord(CgroupRecord):
    quota: int | None  # what it set (None: no quota), so revert restores only while the limit is still its own
    period: int
    previous: tuple[int | None, int] | None = None  # an existing cgroup's limit before it
    # enabling +cpu in the parent (v2) is a change too: recorded before apply, undone by revert if ours
    enables_cpu: bool = False

    def hier(self) -> CpuHierarchy:
        return self.hierarchy.of(CpuHierarchy)


class CpuThrottle(Injector[CpuThrottleSpec, CpuThrottleRecord]):
    executors: ClassVar[frozenset[str]] = NODE_EXECUTORS
    target_field: ClassVar[str | None] = "kubernetes"
    node_helper: ClassVar[NodeHelper] = CGROUP_HELPER
    type: ClassVar[str] = "process.cpu_throttle"
    host_needs: ClassVar[frozenset[str]] = frozenset({"root"})
    Record = CpuThrottleRecord
    summary: ClassVar[str] = ("cap the CPU time of processes or of a cgroup (cpu.max / cpu.cfs_quota_us; revert: moved "
                              "back, or the cgroup's previous limit restored)")
    Spec = CpuThrottleSpec
    spec: CpuThrottleSpec

    def __init__(self, spec: CpuThrottleSpec, ctx: FaultContext | None = None):
        super().__init__(spec, ctx)
        self.cgroup_name = f"chaoskit-{uuid.uuid4().hex[:12]}"  # chosen once, so plan names what apply creates

    def resolve_target(self) -> CgroupTarget:
        hier = find_cpu_hierarchy()
        if self.spec.cgroup is not None:
            return CgroupTarget(hier.to_json(), self.spec.describe(), cgroup=str(hier.root / self.spec.cgroup))
        return cgroup_target(hier, self.spec.select(), self.spec.describe())

    @classmethod
    def cgroup_hierarchy(cls) -> CpuHierarchy:
        return find_cpu_hierarchy()

    def preflight(self) -> None:
        t = self.target_as(CgroupTarget)
        if t.cgroup is None:
            check_targets(self.type, self.spec, target_refs(t), self.spec.describe(), "throttle")
            return
        hier, cg = CpuHierarchy.from_json(t.hierarchy), Path(t.cgroup)
        check_cgroup_target(self.type, hier, cg, self.spec.allow_host)
        if hier.read_limit(cg)[1] == 0:
            raise PreflightError(f"{self.type}: cgroup {cg} has no CPU bandwidth files (on cgroup v2, its parent "
                                 "must have +cpu in cgroup.subtree_control)")

    def plan(self) -> list[str]:
        s = self.spec
        try:
            t = self.target_as(CgroupTarget)
        except PreflightError as e:
            return [f"limit {s.describe()} to {s.cpu:g} CPU (no cpu controller here: {e})"]
        hier = CpuHierarchy.from_json(t.hierarchy)
        if t.cgroup is not None:
            quota, period = hier.read_limit(Path(t.cgroup))
            return [f"set {_limit_text(hier, s.quota_us(), s.period_us())} on cgroup {t.cgroup}: {s.cpu:g} CPU "
                    f"per {s.period * 1e3:g}ms period for everything in it",
                    f"revert: restore its previous limit ({_limit_text(hier, quota, period)})"]
        cg = hier.root / self.cgroup_name
        more = f" (more than the {host_cpus()} CPUs here: no limit in effect)" if s.cpu >= host_cpus() else ""
        lines = [f"create cgroup {cg} (cgroup v{hier.version}) with {_limit_text(hier, s.quota_us(), s.period_us())}"
                 f": {s.cpu:g} CPU ({s.cpu * 100:g}% of one CPU) per {s.period * 1e3:g}ms period{more}"]
        procs = target_procs(t)
        for p in procs:
            lines.append(f"move PID {p.pid} ({p.comm}) with its {len(p.threads)} thread(s) from {p.from_} into it")
        if not procs:
            lines.append(f"move {s.describe()} into it (none running now)")
        lines.append(f"revert: move every thread in {cg} back to its previous cgroup (threads and children started "
                     "meanwhile go where their process came from), then remove the cgroup")
        return lines

    def prepare(self) -> CpuThrottleRecord:
        t = self.target_as(CgroupTarget)
        hier, where = CpuHierarchy.from_json(t.hierarchy), CgroupHierarchy.model_validate(t.hierarchy)
        quota, period = self.spec.quota_us(), self.spec.period_us()
        if t.cgroup is not None:  # its own limit, with the one it had before
            return CpuThrottleRecord(hierarchy=where, cgroup=t.cgroup, dedicated=False, quota=quota, period=period,
                                     previous=hier.read_limit(Path(t.cgroup)))
        return CpuThrottleRecord(hierarchy=where, cgroup=str(hier.root / self.cgroup_name), quota=quota, period=period,
                                 procs=target_procs(t),
                                 enables_cpu=hier.version == 2 and not hier.enabled_in(hier.root))

    def apply(self, record: CpuThrottleRecord) -> CpuThrottleRecord:
        hier, cg = record.hier(), record.path
        if not record.dedicated:
            hier.write_limit(cg, record.quota, record.period)
            return record
        if hier.version == 2:
            hier.enable_in(cg.parent)
        cg.mkdir(exist_ok=True)
        hier.write_limit(cg, record.quota, record.period)
        return record.model_copy(update={"procs": move_in(hier, cg, record.procs, self.type)})

    def watched_processes(self, record: CpuThrottleRecord) -> list[ProcessRef]:
        return record.moved(self.ctx.target)

    @classmethod
    def revert(cls, record: CpuThrottleRecord) -> None:
        hier, cg = record.hier(), record.path
        if not cg.is_dir():
            return
        if not record.dedicated:  # only while the limit is ours (not a later fault's, the kubelet's)
            if hier.read_limit(cg) == (record.quota, record.period) and record.previous is not None:
                hier.write_limit(cg, *record.previous)
            return
        move_back_and_remove(hier, cg, record.procs, cls.type, RMDIR_WAIT_S, poll_s=0.01)
        if record.enables_cpu:
            hier.disable_if_unused(cg.parent)

    @classmethod
    def observe(cls, record: CpuThrottleRecord) -> bool:
        hier, cg = record.hier(), record.path
        if not cg.is_dir() or hier.read_limit(cg) != (record.quota, record.period):
            return False
        return not record.dedicated or any_target_inside(cg, record.procs)

    @classmethod
    def observe_details(cls, record: CpuThrottleRecord) -> dict[str, Any]:
        hier, cg = record.hier(), record.path
        out: dict[str, Any] = {"in_effect": cls.observe(record), "cgroup": str(cg)}
        if cg.is_dir():
            quota, period = hier.read_limit(cg)
            out.update(quota_us=quota, period_us=period, tasks=len(hier.tasks(cg)), cpu_stat=hier.stat(cg))
        return out


# ---------------------------------------------------------------- host.cpu_stress

class CpuStressSpec(StrictModel):
    type: Literal["host.cpu_stress"]
    workers: int | None = Field(None, gt=0, description="busy worker processes (default: one per CPU; at most "
                                                        "4 per CPU)")
    load: Share = Field(1.0, gt=0, le=1, description="share of each worker's time spent busy: 0.8 or '80%' "
                                                     "(default 1.0)")
    nice: int = Field(0, ge=-20, le=19, description="nice value of the workers (19: they only take idle CPU)")


class CpuStressRecord(helper_proc.HelperRecord):
    """host.cpu_stress's record: its token and what its helper runs (workers, load, nice), and once started the
    holder and its workers."""

    workers: int = Field(gt=0)
    load: float
    nice: int
    holder: ProcessRef | None = None
    worker_procs: list[ProcessRef] = Field(default_factory=list)


class CpuStress(helper_proc.HelperFault[CpuStressSpec, CpuStressRecord]):
    type: ClassVar[str] = "host.cpu_stress"
    Record = CpuStressRecord
    helper: ClassVar[str | None] = "chaoskit.injectors.cpu.stress_helper"
    summary: ClassVar[str] = "keep N worker processes busy on the host's CPUs (revert: they exit)"
    Spec = CpuStressSpec
    spec: CpuStressSpec

    def _workers(self) -> int:
        return self.spec.workers if self.spec.workers is not None else host_cpus()

    def preflight(self) -> None:
        if self._workers() > 4 * host_cpus():
            raise PreflightError(f"host.cpu_stress: {self._workers()} workers is more than 4 per CPU "
                                 f"({4 * host_cpus()} on this host's {host_cpus()} CPUs)")

    def plan(self) -> list[str]:
        n, s = self._workers(), self.spec
        return [f"start a helper process with {n} busy worker process(es), each {s.load:.0%} busy at nice "
                f"{s.nice} (about {n * s.load:g} of the {host_cpus()} CPUs here)",
                "revert: SIGTERM the helper and every worker (by recorded PID + start time; SIGKILL after 5 s); "
                f"they also die with chaoskit and exit by themselves after {self.ctx.lifetime_s:g}s"]

    def prepare(self) -> CpuStressRecord:
        return CpuStressRecord(token=f"chaoskit-holder-cpustress-{uuid.uuid4().hex}", workers=self._workers(),
                               load=self.spec.load, nice=self.spec.nice)

    def apply(self, record: CpuStressRecord) -> CpuStressRecord:
        until = time.time() + self.ctx.lifetime_s
        # the helper's PR_SET_PDEATHSIG fires when the spawning *thread* ends (see gpu.py)
        holder = helper_proc.spawn(self.helper, record.token,
                                   [str(record.workers), repr(record.load), str(record.nice), f"{until:.3f}",
                                    str(os.getpid())],
                                   f"CPU stress helper with {record.workers} workers")
        workers = [r for r in find_by_token(record.token) if parent_pid(r.pid) == holder.pid]
        out = record.model_copy(update={"holder": holder, "worker_procs": workers})
        if len(workers) != record.workers:
            type(self).revert(out)
            raise RuntimeError(f"host.cpu_stress: {len(workers)} of {record.workers} workers are running")
        return out

    @classmethod
    def revert(cls, record: CpuStressRecord) -> None:
        refs = [p for p in (record.holder, *record.worker_procs) if p is not None]
        refs += [p for p in find_by_token(record.token) if p not in refs]  # e.g. apply died half-way
        _terminate(refs)

    @classmethod
    def observe(cls, record: CpuStressRecord) -> bool:
        return is_alive(record.holder) if record.holder is not None else helper_proc.running(record.token)

    @classmethod
    def observe_details(cls, record: CpuStressRecord) -> dict[str, Any]:
        return {"in_effect": cls.observe(record), "workers_alive": sum(map(is_alive, record.worker_procs))}


def _terminate(refs: list[ProcessRef], grace_s: float = 5.0) -> None:
    """SIGTERM each process that is still that very process (PID + start time), SIGKILL what is left."""
    for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 2.0)):
        refs = [r for r in refs if is_alive(r)]
        for ref in refs:
            try:
                os.kill(ref.pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + wait_s
        while refs and time.monotonic() < deadline:
            refs = [r for r in refs if is_alive(r)]
            time.sleep(0.01)
        if not refs:
            return
