"""disk.throttle: cap read/write bytes and IOPS of target processes on the disk behind a path (cgroup io/blkio)."""

from __future__ import annotations

import os
import uuid
from pathlib import Path
from typing import ClassVar, Literal

from pydantic import Field, field_validator, model_validator

from chaoskit.errors import PreflightError
from chaoskit.injectors.base import CGROUP_HELPER, NODE_EXECUTORS, Injector, NodeHelper
from chaoskit.injectors.cgroup_move import CgroupHierarchy, CgroupRecord, MovedProcess, target_procs
from chaoskit.injectors.process.fault import check_cgroup_path, check_cgroup_target
from chaoskit.model.types import StrictModel
from chaoskit.targets.blockdev import BlockTarget, resolve_path, root_disk
from chaoskit.targets.cgroups import LIMIT_KEYS, IoHierarchy, find_io_hierarchy
from chaoskit.targets.kube import KubeNodeSelector
from chaoskit.targets.local import CgroupTarget
from chaoskit.targets.process import ProcessRef, find_by_name, is_alive, proc_ref
from chaoskit.units import format_size, parse_size


class DiskThrottleSpec(StrictModel):
    type: Literal["disk.throttle"]
    path: str = Field(min_length=1, description="a file, directory or block device; its whole disk is throttled "
                                                "(with kubernetes: as the container sees it)")
    rbps: str | int | None = Field(None, description="read bytes per second, e.g. '2MiB'")
    wbps: str | int | None = Field(None, description="write bytes per second")
    riops: int | None = Field(None, gt=0, description="read operations per second")
    wiops: int | None = Field(None, gt=0, description="write operations per second")
    pid: int | list[int] | None = Field(None, description="target process(es); moved into a dedicated cgroup")
    name: str | None = Field(None, min_length=1, description="regex on process names (comm)")
    cgroup: str | None = Field(None, min_length=1, description="existing cgroup (relative to the hierarchy root) "
                                                               "whose limit lines are set and later restored")
    kubernetes: KubeNodeSelector | None = Field(None, description="the chosen pods' container cgroups (each limited "
                                                                "on its node, through a helper pod)")
    allow_host: bool = Field(False, description="allow throttling the disk that holds /")

    @field_validator("cgroup")
    @classmethod
    def _relative(cls, v: str | None) -> str | None:
        return check_cgroup_path(v)

    @field_validator("rbps", "wbps")
    @classmethod
    def _bps(cls, v: str | int | None) -> str | int | None:
        if v is not None and parse_size(v) <= 0:
            raise ValueError("a limit of 0 would stop all I/O; give a positive rate like '2MiB'")
        return v

    @model_validator(mode="after")
    def _check(self) -> DiskThrottleSpec:
        if all(getattr(self, k) is None for k in LIMIT_KEYS):
            raise ValueError("give at least one of rbps, wbps, riops, wiops")
        if sum(x is not None for x in (self.pid, self.name, self.cgroup, self.kubernetes)) != 1:
            raise ValueError("give exactly one target: pid, name, cgroup or kubernetes")
        return self

    def limits(self) -> dict[str, str]:
        out = {}
        for key in LIMIT_KEYS:
            v = getattr(self, key)
            if v is not None:
                out[key] = str(parse_size(v) if key.endswith("bps") else v)
        return out


class DiskThrottleRecord(CgroupRecord):
    dedicated: bool  # always recorded
    dev: str
    limits: dict[str, str]  # what it set, so revert restores only while a limit is still its own
    previous: dict[str, str] = Field(default_factory=dict)
    # enabling +io in the parent (v2) is a change too: recorded before apply, undone by revert if ours
    enables_io: bool = False

    def hier(self) -> IoHierarchy:
        return self.hierarchy.of(IoHierarchy)


class DiskThrottle(Injector[DiskThrottleSpec, DiskThrottleRecord]):
    executors: ClassVar[frozenset[str]] = NODE_EXECUTORS
    target_field: ClassVar[str | None] = "kubernetes"
    node_helper: ClassVar[NodeHelper] = NodeHelper(  # its path is read through /proc/PID/root of the container's init
        capabilities=("SYS_PTRACE",), host_paths=CGROUP_HELPER.host_paths)
    type: ClassVar[str] = "disk.throttle"
    host_needs: ClassVar[frozenset[str]] = frozenset({"root", "cgroup-io"})
    Record = DiskThrottleRecord
    summary: ClassVar[str] = "throttle read/write bytes and IOPS on the disk behind a path (cgroup io.max / blkio)"
    Spec = DiskThrottleSpec
    spec: DiskThrottleSpec

    def _device(self) -> BlockTarget:
        return resolve_path(self.spec.path)

    def _pids(self) -> list[ProcessRef]:
        s = self.spec
        if s.pid is not None:
            refs = [proc_ref(p) for p in ([s.pid] if isinstance(s.pid, int) else s.pid)]
            return [r for r in refs if r is not None]
        if s.name is not None:
            return find_by_name(s.name)
        return []

    @classmethod
    def cgroup_hierarchy(cls) -> IoHierarchy:
        return find_io_hierarchy()

    def resolve_target(self) -> CgroupTarget:
        """An existing cgroup (`cgroup:`), or the processes, each with its io cgroup now."""
        hier, s = find_io_hierarchy(), self.spec
        if s.cgroup is not None:
            return CgroupTarget(hier.to_json(), f"cgroup {s.cgroup}", cgroup=str(hier.root / s.cgroup))
        procs = []
        for r in self._pids():
            try:
                home = hier.cgroup_of(r.pid)
            except PreflightError:  # it exited meanwhile
                continue
            procs.append(MovedProcess(pid=r.pid, start_time=r.start_time, comm=r.comm, from_=str(home)).to_json())
        return CgroupTarget(hier.to_json(), f"{s.pid or s.name}", tuple(procs))

    def preflight(self) -> None:
        t, dev = self.target_as(CgroupTarget), self._device()
        # a path through a process's root (a pod's container, from its node's helper): the node's / is PID 1's
        node_root = "/proc/1/root" if self.spec.path.startswith("/proc/") else "/"
        if not self.spec.allow_host:
            try:  # never fail open on a node: a root we may not look at is not a root without a disk
                os.stat(node_root)
            except OSError as e:
                raise PreflightError(f"disk.throttle: cannot tell which disk holds the node's root ({node_root}: "
                                     f"{e.strerror}); set allow_host: true to throttle without that check") from None
            if dev.disk == root_disk(root=node_root):
                raise PreflightError(f"disk.throttle: {dev.disk_name} [{dev.disk}] holds the root filesystem; "
                                     "set allow_host: true to throttle it")
        if t.cgroup is not None:
            check_cgroup_target(self.type, IoHierarchy.from_json(t.hierarchy), Path(t.cgroup), self.spec.allow_host)
        if t.cgroup is None and not t.procs:
            raise PreflightError(f"disk.throttle: no running process matches {t.selector}")

    def plan(self) -> list[str]:
        dev = self._device()
        lim = ", ".join(f"{k}={format_size(int(v)) + '/s' if k.endswith('bps') else v}"
                        for k, v in self.spec.limits().items())
        t = self.target_as(CgroupTarget)
        if t.cgroup is not None:
            who = f"cgroup {self.spec.cgroup} (previous limit lines restored on revert)"
        else:
            who = (f"PIDs {', '.join(str(p.pid) for p in target_procs(t)) or '(none now)'} moved into a dedicated "
                   "cgroup (moved back on revert)")
        return [dev.describe(), f"limit {lim} on {dev.disk} for {who}"]

    def prepare(self) -> DiskThrottleRecord:
        t, dev = self.target_as(CgroupTarget), self._device()
        hier, where = IoHierarchy.from_json(t.hierarchy), CgroupHierarchy.model_validate(t.hierarchy)
        if t.cgroup is not None:
            return DiskThrottleRecord(hierarchy=where, dev=dev.disk, limits=self.spec.limits(), cgroup=t.cgroup,
                                      previous=hier.read_limits(Path(t.cgroup), dev.disk), dedicated=False)
        return DiskThrottleRecord(hierarchy=where, dev=dev.disk, limits=self.spec.limits(),
                                  cgroup=str(hier.root / f"chaoskit-{uuid.uuid4().hex[:12]}"), dedicated=True,
                                  procs=target_procs(t),
                                  enables_io=hier.version == 2 and not hier.enabled_in(hier.root))

    def apply(self, record: DiskThrottleRecord) -> DiskThrottleRecord:
        hier, cg = record.hier(), record.path
        if record.dedicated:
            cg.mkdir(exist_ok=True)
            if hier.version == 2:
                hier.enable_in(cg.parent)
        hier.write_limits(cg, record.dev, record.limits)
        for p in record.procs:
            if is_alive(p.ref()):
                hier.move(p.pid, cg)
        return record

    def watched_processes(self, record: DiskThrottleRecord) -> list[ProcessRef]:
        return record.moved(self.ctx.target)

    @classmethod
    def revert(cls, record: DiskThrottleRecord) -> None:
        hier, cg = record.hier(), record.path
        if not record.dedicated:
            now = hier.read_limits(cg, record.dev) if cg.is_dir() else {}
            if any(now.get(k) == v for k, v in record.limits.items()):  # ours, even half-applied; not a later fault's
                prev = record.previous
                hier.write_limits(cg, record.dev, {k: prev.get(k, hier.unlimited()) for k in record.limits})
            return
        if not cg.is_dir():
            return
        for p in record.procs:
            if is_alive(p.ref()) and Path(p.from_).is_dir():
                try:
                    hier.move(p.pid, Path(p.from_))
                except (ProcessLookupError, OSError):
                    pass
        fallback = Path(record.procs[0].from_) if record.procs else cg.parent
        for pid in hier.procs(cg):  # children forked while throttled go where their parent came from
            try:
                hier.move(pid, fallback if fallback.is_dir() else cg.parent)
            except (ProcessLookupError, OSError):
                pass
        try:
            os.rmdir(cg)
        except FileNotFoundError:
            pass
        if record.enables_io:
            hier.disable_if_unused(cg.parent)

    @classmethod
    def observe(cls, record: DiskThrottleRecord) -> bool:
        hier, cg = record.hier(), record.path
        if not cg.is_dir():
            return False
        now = hier.read_limits(cg, record.dev)
        return all(now.get(k) == v for k, v in record.limits.items())
