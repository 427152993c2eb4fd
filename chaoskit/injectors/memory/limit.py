"""process.memory_limit: move target processes into a `chaoskit-*` memory cgroup with a limit (v2 memory.max /
v1 memory.limit_in_bytes), optionally with a holder process inside it that takes part of the room and that the
kernel's OOM killer never picks (oom_score_adj -1000): when the cgroup runs out, a target is OOM-killed.
Revert: the holder stops, surviving targets go back to their previous cgroups, the cgroup is removed.

The holder is chaoskit.injectors.memory.limit_helper (it joins the cgroup, protects itself from the OOM killer and
becomes chaoskit.injectors.memory.holder)."""

from __future__ import annotations

import os
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
    MovedProcess,
    any_target_inside,
    cgroup_target,
    move_back_and_remove,
    move_in,
    target_procs,
    target_refs,
)
from chaoskit.injectors.process.fault import CgroupTargets, check_cgroup_target, check_targets, descendants
from chaoskit.targets.cgroups import MemHierarchy, find_mem_hierarchy
from chaoskit.targets.local import CgroupTarget
from chaoskit.targets.process import ProcessRef, is_alive
from chaoskit.units import format_size, parse_size

RMDIR_WAIT_S = 10.0  # a memory cgroup whose task was just OOM-killed stays busy for a moment


def parse_bytes(value: object) -> int:
    """'300MiB', '1.5GiB', '64M' or a number of bytes; not a percentage (of what?)."""
    if isinstance(value, str) and "%" in value:
        raise ValueError(f"expected a size like '300MiB' (got {value!r}; a percentage has nothing to be of here)")
    return parse_size(value)


Bytes = Annotated[
    int,
    BeforeValidator(parse_bytes),
    WithJsonSchema({"type": ["string", "integer"], "pattern": r"^\d+(\.\d+)?\s*([KMGTkmgt][iI]?[bB]?|[bB])?$",
                    "description": "a size like '300MiB' or '2GiB', or bytes"}),
]


class MemoryLimitSpec(CgroupTargets):
    type: Literal["process.memory_limit"]
    limit: Bytes | None = Field(None, gt=0, description="memory limit of the cgroup the targets are moved into, "
                                                        "e.g. '300MiB' (one of limit or headroom)")
    headroom: Bytes | None = Field(None, gt=0, description="limit = what is charged to the new cgroup right after "
                                                           "the move + this, e.g. '64MiB': how much more the "
                                                           "targets may take (one of limit or headroom)")
    pressure: Bytes | None = Field(None, gt=0, description="a holder process inside the same cgroup takes this "
                                                           "much of the room (oom_score_adj -1000: the kernel's "
                                                           "OOM killer picks a target, never the holder); less "
                                                           "than headroom")
    descendants: bool = Field(False, description="with pid: also every descendant of those processes, e.g. "
                                                 "tritonserver and the python backend stubs it started")

    @model_validator(mode="after")
    def _check(self) -> MemoryLimitSpec:
        if self.descendants and self.pid is None:
            raise ValueError("descendants goes with pid (child_of already selects descendants)")
        if self.pressure is not None and self.kubernetes is not None:
            raise ValueError("pressure is not available on pods: the holder would have to join the container's "
                             "cgroup from the helper pod's own cgroup namespace")
        if (self.limit is None) == (self.headroom is None):
            raise ValueError("give exactly one of limit (absolute, e.g. '300MiB') or headroom (on top of what the "
                             "targets have charged after the move, e.g. '64MiB')")
        room = self.headroom if self.headroom is not None else self.limit
        if self.pressure is not None and room is not None and self.pressure >= room:
            what = "headroom" if self.headroom is not None else "limit"
            raise ValueError(f"pressure ({format_size(self.pressure)}) must be less than {what} "
                             f"({format_size(room)}): the holder takes part of the room and the targets run out "
                             "of the rest; a holder that cannot fit would wait at the limit forever")
        return self


class MemoryLimitRecord(CgroupRecord):
    limit: int | None = None  # as the spec asks: an absolute limit, or
    headroom: int | None = None  # ... what is charged right after the move + this
    pressure: int | None = None  # what its holder takes of the room
    token: str | None = Field(None, pattern=helper_proc.TOKEN)  # of its holder (revert stops what carries it)
    previous: dict[str, str] = Field(default_factory=dict)  # an existing cgroup's limit files before it
    # enabling +memory in the parent (v2) is a change too: recorded before apply, undone by revert if ours
    enables_memory: bool = False
    # once applied: what was charged right after the move, the limit it set, whether the charges moved along
    usage_at_move: int | None = None
    limit_bytes: int | None = None
    charges_moved: bool | None = None
    holder: ProcessRef | None = None  # its holder, once started, and the oom_score_adj the host let it have
    holder_oom_score_adj: int | None = None

    def hier(self) -> MemHierarchy:
        return self.hierarchy.of(MemHierarchy)


class MemoryLimit(Injector[MemoryLimitSpec, MemoryLimitRecord]):
    helper: ClassVar[str | None] = "chaoskit.injectors.memory.limit_helper"
    executors: ClassVar[frozenset[str]] = NODE_EXECUTORS
    target_field: ClassVar[str | None] = "kubernetes"
    node_helper: ClassVar[NodeHelper] = CGROUP_HELPER
    type: ClassVar[str] = "process.memory_limit"
    host_needs: ClassVar[frozenset[str]] = frozenset({"root"})
    Record = MemoryLimitRecord
    summary: ClassVar[str] = ("limit the memory of processes in a cgroup, or of an existing cgroup, optionally with "
                              "an OOM-proof holder taking part of it (memory.max / memory.limit_in_bytes; revert: "
                              "moved back, or the cgroup's previous limits restored)")
    Spec = MemoryLimitSpec
    spec: MemoryLimitSpec

    def __init__(self, spec: MemoryLimitSpec, ctx: FaultContext | None = None):
        super().__init__(spec, ctx)
        self.cgroup_name = f"chaoskit-{uuid.uuid4().hex[:12]}"  # chosen once, so plan names what apply creates

    def resolve_target(self) -> CgroupTarget:
        hier = find_mem_hierarchy()
        if self.spec.cgroup is not None:
            return CgroupTarget(hier.to_json(), self._what(), cgroup=str(hier.root / self.spec.cgroup))
        return cgroup_target(hier, self._select(), self._what())

    @classmethod
    def cgroup_hierarchy(cls) -> MemHierarchy:
        return find_mem_hierarchy()

    def _select(self) -> list[ProcessRef]:
        s = self.spec
        refs = s.select()
        if s.descendants:
            for root in list(refs):
                refs += [d for d in descendants(root.pid) if d not in refs]
        return refs

    def _what(self) -> str:
        s = self.spec
        return s.describe() + (" and their descendants" if s.descendants else "")

    def _limit_words(self) -> str:
        s = self.spec
        if s.limit is not None:
            return f"limit {format_size(s.limit)}"
        return f"limit = what is charged to it right after the move + {format_size(s.headroom or 0)} headroom"

    def preflight(self) -> None:
        if os.geteuid() != 0:
            raise PreflightError("process.memory_limit: needs root (it creates a memory cgroup, moves processes "
                                 "into it and sets oom_score_adj)")
        t = self.target_as(CgroupTarget)
        if t.cgroup is None:
            check_targets(self.type, self.spec, target_refs(t), self._what(), "limit")
            return
        check_cgroup_target(self.type, MemHierarchy.from_json(t.hierarchy), Path(t.cgroup), self.spec.allow_host)
        if not MemHierarchy.from_json(t.hierarchy).limit_files(Path(t.cgroup)):
            raise PreflightError(f"{self.type}: cgroup {t.cgroup} has no memory limit files (on cgroup v2, its "
                                 "parent must have +memory in cgroup.subtree_control)")

    def plan(self) -> list[str]:
        s = self.spec
        try:
            t = self.target_as(CgroupTarget)
        except PreflightError as e:
            return [f"limit the memory of {self._what()} ({self._limit_words()}; no memory controller here: {e})"]
        hier = MemHierarchy.from_json(t.hierarchy)
        if t.cgroup is not None:
            return self._plan_existing(hier, Path(t.cgroup))
        cg = hier.root / self.cgroup_name
        lines = [f"create cgroup {cg} (cgroup v{hier.version} memory) with {self._limit_words()}"
                 + ("" if hier.version == 2 else "; memory.move_charge_at_immigrate = 3 where the kernel still "
                                                 "moves charges")]
        procs = target_procs(t)
        for p in procs:
            lines.append(f"move PID {p.pid} ({p.comm}) from {p.from_} into it")
        if not procs:
            lines.append(f"move {self._what()} into it (none running now)")
        if s.pressure:
            lines.append(f"start a holder process inside it that takes {format_size(s.pressure)} of the room, "
                         "asking for oom_score_adj -1000 so the kernel's OOM killer picks a target, not the holder "
                         "(without CAP_SYS_RESOURCE the host refuses and the killer picks by size; it exits by "
                         f"itself after {self.ctx.lifetime_s:g}s)")
        lines.append(f"revert: stop the holder, move every task in {cg} back to its previous cgroup (children "
                     "started meanwhile go where their parent came from; an OOM-killed target is no error), "
                     "then remove the cgroup")
        return lines

    def _plan_existing(self, hier: MemHierarchy, cg: Path) -> list[str]:
        saved = ", ".join(f"{n} = {t}" for n, t in hier.limit_files(cg).items())
        lines = [f"set {self._limit_words()} on cgroup {cg} (cgroup v{hier.version} memory; swap not allowed) for "
                 "everything in it; nothing is moved"]
        if self.spec.pressure:
            lines.append(f"start a holder process inside it that takes {format_size(self.spec.pressure)} of the "
                         "room (oom_score_adj -1000)")
        return [*lines, f"revert: stop the holder if any, and write back {saved}"]

    def prepare(self) -> MemoryLimitRecord:
        t, s = self.target_as(CgroupTarget), self.spec
        hier, where = MemHierarchy.from_json(t.hierarchy), CgroupHierarchy.model_validate(t.hierarchy)
        token = f"chaoskit-holder-memlimit-{uuid.uuid4().hex}" if s.pressure else None
        asked = {"limit": s.limit, "headroom": s.headroom, "pressure": s.pressure, "token": token}
        if t.cgroup is not None:  # its own limit, with the files it had before
            return MemoryLimitRecord(hierarchy=where, cgroup=t.cgroup, dedicated=False, **asked,
                                     previous=hier.limit_files(Path(t.cgroup)))
        return MemoryLimitRecord(hierarchy=where, cgroup=str(hier.root / self.cgroup_name), **asked,
                                 procs=target_procs(t),
                                 enables_memory=hier.version == 2 and not hier.enabled_in(hier.root))

    def apply(self, record: MemoryLimitRecord) -> MemoryLimitRecord:
        try:
            return self._apply(record)
        except BaseException:
            try:
                type(self).revert(record)  # the prepared record is enough to undo a half-applied limit
            except Exception:
                pass  # the ledger still holds the intent: rollback tries again and reports it
            raise

    def _apply(self, record: MemoryLimitRecord) -> MemoryLimitRecord:
        hier, cg = record.hier(), record.path
        moved: list[MovedProcess] = []
        charges_moved = False
        if record.dedicated:
            if hier.version == 2:
                hier.enable_in(cg.parent)
            cg.mkdir(exist_ok=True)
            charges_moved = hier.move_charges_on_immigrate(cg)
            moved = move_in(hier, cg, record.procs, self.type)
        usage = hier.usage(cg) or 0
        limit = record.limit if record.limit is not None else usage + (record.headroom or 0)
        pressure = record.pressure or 0
        if pressure and pressure >= limit - usage:
            raise RuntimeError(f"process.memory_limit: pressure {format_size(pressure)} does not fit the "
                               f"{format_size(max(limit - usage, 0))} left under the limit {format_size(limit)} "
                               f"({format_size(usage)} charged after the move); raise limit or lower pressure")
        try:
            hier.write_limit(cg, limit)
        except OSError as e:
            raise RuntimeError(f"process.memory_limit: cannot set a limit of {format_size(limit)} on {cg}: "
                               f"{e.strerror} ({format_size(usage)} is charged to it after the move)") from None
        out = record.model_copy(update={"procs": moved, "usage_at_move": usage, "limit_bytes": limit,
                                        "charges_moved": charges_moved})
        if pressure:
            until = time.time() + self.ctx.lifetime_s
            # the holder's PR_SET_PDEATHSIG fires when the spawning *thread* ends (see gpu.py)
            holder = helper_proc.spawn(self.helper, record.token, [str(cg), str(pressure), f"{until:.3f}",
                                                                   str(os.getpid())],
                                       f"memory holder for {format_size(pressure)} in {cg}")
            out = out.model_copy(update={"holder": holder, "holder_oom_score_adj": _oom_score_adj(holder.pid)})
        return out

    def watched_processes(self, record: MemoryLimitRecord) -> list[ProcessRef]:
        return record.moved(self.ctx.target)

    @classmethod
    def revert(cls, record: MemoryLimitRecord) -> None:
        helper_proc.stop(record.token)  # first: it holds memory in the cgroup and is not a target
        hier, cg = record.hier(), record.path
        if not record.dedicated:
            ours = record.limit_bytes  # None: the apply failed part way, and the limit files are ours
            if cg.is_dir() and (ours is None or hier.read_limit(cg) == ours):
                hier.restore_limits(cg, record.previous)
            return
        if cg.is_dir():
            # children started meanwhile go where their parent came from; v1 reclaims what an emptied cgroup holds
            move_back_and_remove(hier, cg, record.procs, cls.type, RMDIR_WAIT_S, poll_s=0.05,
                                 by_parent=True, when_empty=hier.force_empty)
        if record.enables_memory:
            hier.disable_if_unused(cg.parent)

    @classmethod
    def observe(cls, record: MemoryLimitRecord) -> bool:
        hier, cg = record.hier(), record.path
        if not cg.is_dir() or record.limit_bytes is None or hier.read_limit(cg) != record.limit_bytes:
            return False
        return not record.dedicated or any_target_inside(cg, record.procs)

    @classmethod
    def observe_details(cls, record: MemoryLimitRecord) -> dict[str, Any]:
        hier, cg = record.hier(), record.path
        alive = [p for p in record.procs if is_alive(p.ref())]
        out: dict[str, Any] = {
            "in_effect": cls.observe(record), "cgroup": str(cg), "charges_moved": record.charges_moved,
            "usage_at_move": record.usage_at_move,
            "survivors": [f"{p.pid} {p.comm}" for p in alive],
            "gone": [f"{p.pid} {p.comm}" for p in record.procs if p not in alive],  # OOM-killed, or exited
        }
        if record.holder is not None:
            out["holder_alive"] = is_alive(record.holder)
            out["holder_bytes"] = record.pressure
            out["holder_oom_score_adj"] = record.holder_oom_score_adj  # -1000 unless the host refused it
        if cg.is_dir():
            events = hier.events(cg)
            # times a charge hit the limit: v1 counts memory and memory+swap apart, v2 says `max`
            hits = events.get("failcnt", 0) + events.get("memsw_failcnt", 0) if hier.version == 1 else events.get("max")
            out.update(limit=hier.read_limit(cg), usage=hier.usage(cg), peak=hier.peak(cg), events=events,
                       failcnt=hits, oom_kills=events.get("oom_kill"), tasks=len(hier.tasks(cg)))
        return out


def _oom_score_adj(pid: int) -> int | None:
    try:
        return int(Path(f"/proc/{pid}/oom_score_adj").read_text())
    except (OSError, ValueError):
        return None
