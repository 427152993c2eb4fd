"""process.cpu_throttle: cap the CPU time of target processes (cgroup v2 cpu.max / v1 CFS quota);
host.cpu_stress: busy worker processes that take CPU from everything else (a helper process; revert = it exits)."""

from __future__ import annotations

import errno
import os
import re
import signal
import time
import uuid
from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal

from pydantic import BaseModel, BeforeValidator, Field, WithJsonSchema, field_validator, model_validator

from chaoskit.errors import PreflightError
from chaoskit.injectors import helper_proc
from chaoskit.injectors.base import Injector
from chaoskit.injectors.process import (
    check_regex,
    check_selector,
    describe_selector,
    refuse_protected,
    select_processes,
)
from chaoskit.spec.types import Duration, StrictModel
from chaoskit.targets.cgroups import CpuHierarchy, IoHierarchy, find_cpu_hierarchy
from chaoskit.targets.process import ProcessRef, find_by_token, is_alive, parent_pid, proc_ref, thread_group, threads

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

class CpuThrottleSpec(StrictModel):
    type: Literal["process.cpu_throttle"]
    cpu: Share = Field(gt=0, le=MAX_CPUS, description="CPU time allowed, in CPUs: 0.2 or '20%' = a fifth of one "
                                                      "CPU, 1.5 = one and a half")
    period: Duration = Field(0.1, description="CFS period the quota is enforced over, 1ms..1s (default 100ms)")
    pid: int | list[int] | None = Field(None, description="target process(es); moved into a dedicated cgroup")
    name: str | None = Field(None, min_length=1, description="regex on process names (comm); with child_of, "
                                                             "among that PID's descendants")
    child_of: int | None = Field(None, gt=0, description="descendants (recursive) of this PID, e.g. "
                                                         "'{target.replica_pid}'; narrowed by name if given")
    full_cmdline: bool = Field(False, description="match `name` against the whole command line")
    allow_host: bool = Field(False, description="allow PID 1 and chaoskit's own ancestors")

    @field_validator("pid")
    @classmethod
    def _pids(cls, v: int | list[int] | None) -> int | list[int] | None:
        if v is not None and (v == [] or any(p <= 0 for p in ([v] if isinstance(v, int) else v))):
            raise ValueError("PIDs are positive integers (and a list needs at least one)")
        return v

    @field_validator("name")
    @classmethod
    def _regex(cls, v: str | None) -> str | None:
        return check_regex(v)

    @model_validator(mode="after")
    def _check(self) -> CpuThrottleSpec:
        check_selector(self.pid, self.name, self.child_of)
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


def _limit_text(hier: CpuHierarchy, quota: int, period: int) -> str:
    if hier.version == 2:
        return f"cpu.max = '{quota} {period}'"
    return f"cpu.cfs_period_us = {period}, cpu.cfs_quota_us = {quota}"


class CpuThrottle(Injector):
    type: ClassVar[str] = "process.cpu_throttle"
    summary: ClassVar[str] = "cap the CPU time of processes (cgroup cpu.max / cpu.cfs_quota_us; revert: moved back)"
    Spec = CpuThrottleSpec
    spec: CpuThrottleSpec

    def __init__(self, spec: BaseModel):
        super().__init__(spec)
        self.cgroup_name = f"chaoskit-{uuid.uuid4().hex[:12]}"  # chosen once, so plan names what apply creates

    def _targets(self) -> list[ProcessRef]:
        s = self.spec
        return select_processes(s.pid, s.name, s.child_of, s.full_cmdline, s.allow_host)

    def _what(self) -> str:
        return describe_selector(self.spec.pid, self.spec.name, self.spec.child_of)

    def preflight(self) -> None:
        find_cpu_hierarchy()
        if self.spec.child_of is not None and proc_ref(self.spec.child_of) is None:
            raise PreflightError(f"process.cpu_throttle: child_of: no running process with PID {self.spec.child_of}")
        refs = self._targets()
        if not refs:
            raise PreflightError(f"process.cpu_throttle: no running process matches {self._what()}")
        if not self.spec.allow_host:
            refuse_protected("process.cpu_throttle", refs, "throttle")

    def plan(self) -> list[str]:
        s, refs = self.spec, self._targets()
        try:
            hier = find_cpu_hierarchy()
        except PreflightError as e:
            return [f"limit {self._what()} to {s.cpu:g} CPU (no cpu controller here: {e})"]
        cg = hier.root / self.cgroup_name
        more = f" (more than the {host_cpus()} CPUs here: no limit in effect)" if s.cpu >= host_cpus() else ""
        lines = [f"create cgroup {cg} (cgroup v{hier.version}) with {_limit_text(hier, s.quota_us(), s.period_us())}"
                 f": {s.cpu:g} CPU ({s.cpu * 100:g}% of one CPU) per {s.period * 1e3:g}ms period{more}"]
        for r in refs:
            lines.append(f"move PID {r.pid} ({r.comm}) with its {len(threads(r.pid))} thread(s) from "
                         f"{hier.cgroup_of(r.pid)} into it")
        if not refs:
            lines.append(f"move {self._what()} into it (none running now)")
        lines.append(f"revert: move every thread in {cg} back to its previous cgroup (threads and children started "
                     "meanwhile go where their process came from), then remove the cgroup")
        return lines

    def prepare(self) -> dict[str, Any]:
        hier = find_cpu_hierarchy()
        procs = [p for p in (_proc_record(hier, r) for r in self._targets()) if p is not None]
        return {"hierarchy": hier.to_json(), "cgroup": str(hier.root / self.cgroup_name),
                "quota": self.spec.quota_us(), "period": self.spec.period_us(), "procs": procs,
                # enabling +cpu in the parent is a change too: recorded before apply, undone by revert if ours
                "enables_cpu": hier.version == 2 and not _cpu_enabled(hier.root)}

    def apply(self, record: dict[str, Any]) -> dict[str, Any]:
        hier, cg = CpuHierarchy.from_json(record["hierarchy"]), Path(record["cgroup"])
        if hier.version == 2:
            _enable_cpu(cg.parent)
        cg.mkdir(exist_ok=True)
        hier.write_limit(cg, record["quota"], record["period"])
        moved = []
        for p in record["procs"]:
            ref = ProcessRef.from_json(p)
            if not is_alive(ref):
                continue
            known = {t["tid"] for t in p["threads"]}  # threads started since prepare: where they are now
            extra = [{"tid": t, "from": str(c)} for t in threads(ref.pid)
                     if t not in known and (c := hier.cgroup_of(ref.pid, t)) is not None]
            try:
                IoHierarchy.move(ref.pid, cg)  # cgroup.procs: every thread of the process at once (v1 and v2)
            except ProcessLookupError:
                continue
            moved.append({**p, "threads": p["threads"] + extra})
        if not moved:
            raise RuntimeError("process.cpu_throttle: every target exited before it could be moved")
        return {**record, "procs": moved}

    @classmethod
    def revert(cls, record: dict[str, Any]) -> None:
        hier, cg = CpuHierarchy.from_json(record["hierarchy"]), Path(record["cgroup"])
        if not cg.is_dir():
            return
        procs = record.get("procs", [])
        by_pid = {p["pid"]: Path(p["from"]) for p in procs}
        by_tid = {(p["pid"], t["tid"]): Path(t["from"]) for p in procs for t in p["threads"]}
        fallback = Path(procs[0]["from"]) if procs else hier.root
        deadline = time.monotonic() + RMDIR_WAIT_S
        while True:
            # only what is in our cgroup now is moved: a task someone else moved meanwhile is left alone
            tasks = [(p, p) for p in IoHierarchy.procs(cg)] if hier.version == 2 else \
                [(thread_group(t), t) for t in hier.tasks(cg)]
            for pid, tid in tasks:
                if pid is None:
                    continue
                dest = by_tid.get((pid, tid)) or by_pid.get(pid) or fallback
                try:
                    hier.move_task(pid, tid, dest if dest.is_dir() else hier.root)
                except OSError:  # exited meanwhile (ESRCH) or not movable: the rmdir below tells
                    pass
            try:
                os.rmdir(cg)
                break
            except FileNotFoundError:
                break
            except OSError as e:
                if e.errno != errno.EBUSY or time.monotonic() > deadline:
                    left = hier.tasks(cg)
                    raise RuntimeError(f"process.cpu_throttle: cannot remove {cg}: {e.strerror}; "
                                       f"tasks still in it: {left[:10]}") from None
                time.sleep(0.01)
        if record.get("enables_cpu"):
            _disable_cpu_if_unused(cg.parent)

    @classmethod
    def observe(cls, record: dict[str, Any]) -> bool:
        hier, cg = CpuHierarchy.from_json(record["hierarchy"]), Path(record["cgroup"])
        if not cg.is_dir() or hier.read_limit(cg) != (record["quota"], record["period"]):
            return False
        inside = set(IoHierarchy.procs(cg))
        return any(p["pid"] in inside and is_alive(ProcessRef.from_json(p)) for p in record.get("procs", []))

    @classmethod
    def observe_details(cls, record: dict[str, Any]) -> dict[str, Any]:
        hier, cg = CpuHierarchy.from_json(record["hierarchy"]), Path(record["cgroup"])
        out: dict[str, Any] = {"in_effect": cls.observe(record), "cgroup": str(cg)}
        if cg.is_dir():
            quota, period = hier.read_limit(cg)
            out.update(quota_us=quota, period_us=period, tasks=len(hier.tasks(cg)), cpu_stat=hier.stat(cg))
        return out


def _proc_record(hier: CpuHierarchy, ref: ProcessRef) -> dict[str, Any] | None:
    """The target with its cgroup and each thread's cgroup before the move; None if it is gone."""
    home = hier.cgroup_of(ref.pid)
    if home is None:
        return None
    tids = [{"tid": t, "from": str(c)} for t in threads(ref.pid) if (c := hier.cgroup_of(ref.pid, t)) is not None]
    return {**ref.to_json(), "from": str(home), "threads": tids}


def _cpu_enabled(parent: Path) -> bool:
    return "cpu" in (parent / "cgroup.subtree_control").read_text().split()


def _enable_cpu(parent: Path) -> None:
    if not _cpu_enabled(parent):
        (parent / "cgroup.subtree_control").write_text("+cpu\n")


def _disable_cpu_if_unused(parent: Path) -> None:
    """Undo the +cpu chaoskit enabled, unless a child cgroup now has a cpu limit of its own (someone else's)."""
    if not _cpu_enabled(parent):
        return
    for child in parent.iterdir():
        cpu_max = child / "cpu.max"
        if child.is_dir() and cpu_max.exists() and not cpu_max.read_text().startswith("max "):
            return
    (parent / "cgroup.subtree_control").write_text("-cpu\n")


# ---------------------------------------------------------------- host.cpu_stress

class CpuStressSpec(StrictModel):
    type: Literal["host.cpu_stress"]
    workers: int | None = Field(None, gt=0, description="busy worker processes (default: one per CPU; at most "
                                                        "4 per CPU)")
    load: Share = Field(1.0, gt=0, le=1, description="share of each worker's time spent busy: 0.8 or '80%' "
                                                     "(default 1.0)")
    nice: int = Field(0, ge=-20, le=19, description="nice value of the workers (19: they only take idle CPU)")


class CpuStress(helper_proc.HelperFault):
    type: ClassVar[str] = "host.cpu_stress"
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
                f"they also die with chaoskit and exit by themselves after {self.max_lifetime_s:g}s"]

    def prepare(self) -> dict[str, Any]:
        return {"token": f"chaoskit-holder-cpustress-{uuid.uuid4().hex}", "workers": self._workers(),
                "load": self.spec.load, "nice": self.spec.nice}

    def apply(self, record: dict[str, Any]) -> dict[str, Any]:
        until = time.time() + self.max_lifetime_s
        # the helper's PR_SET_PDEATHSIG fires when the spawning *thread* ends (see gpu.py)
        holder = helper_proc.spawn("chaoskit.injectors.cpu_stress_proc", record["token"],
                                   [str(record["workers"]), repr(record["load"]), str(record["nice"]),
                                    f"{until:.3f}", str(os.getpid())],
                                   f"CPU stress helper with {record['workers']} workers")
        workers = [r for r in find_by_token(record["token"]) if parent_pid(r.pid) == holder.pid]
        out = {**record, "holder": holder.to_json(), "worker_procs": [w.to_json() for w in workers]}
        if len(workers) != record["workers"]:
            type(self).revert(out)
            raise RuntimeError(f"host.cpu_stress: {len(workers)} of {record['workers']} workers are running")
        return out

    @classmethod
    def revert(cls, record: dict[str, Any]) -> None:
        refs = [ProcessRef.from_json(p) for p in [record.get("holder"), *record.get("worker_procs", [])] if p]
        token = record.get("token")
        refs += [r for r in (find_by_token(token) if token else []) if r not in refs]  # e.g. apply died half-way
        _terminate(refs)

    @classmethod
    def observe(cls, record: dict[str, Any]) -> bool:
        if record.get("holder"):
            return is_alive(ProcessRef.from_json(record["holder"]))
        return helper_proc.running(record.get("token"))

    @classmethod
    def observe_details(cls, record: dict[str, Any]) -> dict[str, Any]:
        alive = sum(is_alive(ProcessRef.from_json(w)) for w in record.get("worker_procs", []))
        return {"in_effect": cls.observe(record), "workers_alive": alive}


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
