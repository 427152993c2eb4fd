"""MIG layout logic (no NVML here): state, mig-parted style layouts, plans, apply, checkpoint restore and comparison.

Semantics follow NVIDIA mig-parted: a layout is its `mig-devices` form (one entry per compute instance, "1g.18gb"
for a CI that fills its GPU instance, "1c.3g.71gb" for a 1-slice CI inside a 3g GPU instance); a checkpoint is the
full state (mode + every GPU instance and compute instance with its placement), and a restore is checked by a
full-state comparison. Instance ids are not compared: NVML assigns new ids on creation (mig-parted's state has none).
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

PROFILE_RE = re.compile(r"^(?:(?P<c>\d+)c\.)?(?P<gi>(?P<g>\d+)g\.\d+gb(?:\+[a-z][a-z0-9]*(?:,[a-z][a-z0-9]*)*)?)$")
CI_SLICE_SIZES = (1, 2, 3, 4, 6, 7, 8)  # the compute-instance sizes NVML has profiles for


class MigError(Exception):
    """A MIG operation failed, or its result is not what was asked for."""


class MigPlanError(MigError):
    """The target layout cannot be planned on this GPU (unknown profile, does not fit)."""


class MigMismatch(MigError):
    """The state after a restore differs from the checkpoint."""

    def __init__(self, differences: list[str]):
        self.differences = differences
        super().__init__("MIG state differs from the checkpoint: " + "; ".join(differences))


# ---------------------------------------------------------------- state


@dataclass(frozen=True, order=True)
class Placement:
    start: int
    size: int

    def __str__(self) -> str:
        return f"start={self.start} size={self.size}"

    def overlaps(self, other: Placement) -> bool:
        return self.start < other.start + other.size and other.start < self.start + self.size


@dataclass(frozen=True)
class ComputeInstance:
    id: int
    profile: str  # mig-parted name: "1g.18gb" (fills the GI) or "1c.3g.71gb"
    profile_id: int
    slices: int
    placement: Placement  # within the GPU instance


@dataclass(frozen=True)
class GpuInstance:
    id: int
    profile: str  # "3g.71gb"
    profile_id: int  # NVML's profile info id (the one nvidia-smi -lgip shows)
    slices: int
    placement: Placement  # memory slices on the GPU
    compute_instances: tuple[ComputeInstance, ...] = ()


@dataclass(frozen=True)
class MigState:
    uuid: str
    mode_current: bool
    mode_pending: bool
    gpu_instances: tuple[GpuInstance, ...] = ()


@dataclass(frozen=True)
class GiProfile:
    name: str
    profile_id: int
    slices: int
    memory_mib: int
    placements: tuple[Placement, ...]


@dataclass(frozen=True)
class DeviceFacts:
    uuid: str
    name: str
    mig_capable: bool
    mode_change_needs_reset: bool  # Ampere: a MIG mode change takes effect after a GPU reset; Hopper+: at once


@dataclass(frozen=True)
class ComputeProcess:
    pid: int
    name: str
    used_memory: int | None


class MigBackend(Protocol):
    """The operations the logic needs from NVML, for one device (index, UUID or PCI bus id)."""

    def describe(self, device: int | str) -> DeviceFacts: ...
    def read_state(self, device: int | str) -> MigState: ...
    def profiles(self, device: int | str) -> Mapping[str, GiProfile]: ...
    def set_mode(self, device: int | str, enabled: bool) -> None: ...
    def create_gi(self, device: int | str, profile_id: int, placement: Placement) -> int: ...
    def create_ci(self, device: int | str, gi_id: int, slices: int, placement: Placement | None) -> int: ...
    def destroy_ci(self, device: int | str, gi_id: int, ci_id: int) -> None: ...
    def destroy_gi(self, device: int | str, gi_id: int) -> None: ...
    def compute_processes(self, device: int | str) -> list[ComputeProcess]: ...


# ---------------------------------------------------------------- JSON (plain data for the ledger)


def to_json(state: MigState) -> dict[str, Any]:
    def place(p: Placement) -> dict[str, int]:
        return {"start": p.start, "size": p.size}

    return {"uuid": state.uuid, "mode_current": state.mode_current, "mode_pending": state.mode_pending,
            "gpu_instances": [
                {"id": gi.id, "profile": gi.profile, "profile_id": gi.profile_id, "slices": gi.slices,
                 "placement": place(gi.placement),
                 "compute_instances": [{"id": ci.id, "profile": ci.profile, "profile_id": ci.profile_id,
                                        "slices": ci.slices, "placement": place(ci.placement)}
                                       for ci in gi.compute_instances]}
                for gi in state.gpu_instances]}


def from_json(data: Mapping[str, Any]) -> MigState:
    def place(d: Mapping[str, Any]) -> Placement:
        return Placement(int(d["start"]), int(d["size"]))

    gis = tuple(
        GpuInstance(int(g["id"]), str(g["profile"]), int(g["profile_id"]), int(g["slices"]), place(g["placement"]),
                    tuple(ComputeInstance(int(c["id"]), str(c["profile"]), int(c["profile_id"]), int(c["slices"]),
                                          place(c["placement"])) for c in g["compute_instances"]))
        for g in data["gpu_instances"])
    return MigState(str(data["uuid"]), bool(data["mode_current"]), bool(data["mode_pending"]), gis)


# ---------------------------------------------------------------- layouts


def parse_profile(name: str) -> tuple[str, int | None]:
    """'1g.18gb' -> ('1g.18gb', None) (one CI filling the GI); '1c.3g.71gb' -> ('3g.71gb', 1)."""
    m = PROFILE_RE.match(name)
    if not m:
        raise ValueError(f"{name!r} is not a MIG profile name like '1g.18gb' or '1c.3g.71gb'")
    g, c = int(m["g"]), int(m["c"]) if m["c"] else None
    if g == 0 or c == 0:
        raise ValueError(f"{name!r}: slice counts start at 1")
    if c is not None and c > g:
        raise ValueError(f"{name!r}: a compute instance ({c}c) cannot be larger than its GPU instance ({g}g)")
    return m["gi"], None if c == g else c


def ci_name(gi_profile: str, gi_slices: int, ci_slices: int) -> str:
    return gi_profile if ci_slices == gi_slices else f"{ci_slices}c.{gi_profile}"


def normalize_target(target: Mapping[str, int]) -> dict[str, int]:
    """Canonical names ('3c.3g.71gb' -> '3g.71gb'), zero counts dropped."""
    out: Counter[str] = Counter()
    for name, count in target.items():
        gi, c = parse_profile(name)
        if count:
            out[gi if c is None else f"{c}c.{gi}"] += count
    return dict(sorted(out.items()))


def layout_of(state: MigState) -> dict[str, int]:
    """mig-parted's `mig-devices` form: one count per (GI profile, CI size); empty when MIG mode is off.
    Like mig-parted, a GPU instance without compute instances does not show up."""
    if not state.mode_current:
        return {}
    names = Counter(ci_name(gi.profile, gi.slices, ci.slices) for gi in state.gpu_instances
                    for ci in gi.compute_instances)
    return dict(sorted(names.items()))


def format_layout(layout: Mapping[str, int]) -> str:
    return ", ".join(f"{n}x {name}" for name, n in sorted(layout.items())) or "no MIG devices"


# ---------------------------------------------------------------- operations


@dataclass(frozen=True)
class MigOp:
    """One NVML call of a plan. create_ci names its GPU instance by placement start (ids are known only later)."""

    action: str  # enable_mig | disable_mig | destroy_ci | destroy_gi | create_gi | create_ci
    profile: str = ""
    profile_id: int | None = None
    gi_id: int | None = None
    ci_id: int | None = None
    slices: int | None = None
    placement: Placement | None = None
    gi_start: int | None = None
    gi_profile: str = ""

    def describe(self) -> str:
        a = self.action
        if a in ("enable_mig", "disable_mig"):
            return f"{a.split('_')[0]} MIG mode"
        if a == "destroy_ci":
            return f"destroy compute instance {self.ci_id} ({self.profile}) in GPU instance {self.gi_id}"
        if a == "destroy_gi":
            return f"destroy GPU instance {self.gi_id} ({self.profile}, {self.placement})"
        if a == "create_gi":
            return f"create GPU instance {self.profile} (profile id {self.profile_id}) at placement {self.placement}"
        where = f"in the {self.gi_profile} GPU instance at start={self.gi_start}"
        at = f"at placement {self.placement}" if self.placement else "(placement chosen by the driver)"
        return f"create compute instance {self.profile} ({self.slices} slice(s)) {where} {at}"


@dataclass(frozen=True)
class _Unit:
    """A GPU instance to create: its profile and the sizes of its compute instances."""

    gi: GiProfile
    cis: tuple[int, ...]

    @property
    def shape(self) -> tuple[str, tuple[int, ...]]:
        return self.gi.name, tuple(sorted(self.cis))


def _units(want: Mapping[str, int], profiles: Mapping[str, GiProfile]) -> list[_Unit]:
    units = []
    for name, count in want.items():
        gi_name, c = parse_profile(name)
        gi = profiles.get(gi_name)
        if gi is None:
            raise MigPlanError(f"{name}: this GPU has no {gi_name} profile (it has: {', '.join(sorted(profiles))})")
        if c is None:
            units += [_Unit(gi, (gi.slices,))] * count
            continue
        if c not in CI_SLICE_SIZES:
            raise MigPlanError(f"{name}: there is no {c}-slice compute instance profile")
        per_gi = gi.slices // c
        while count > 0:
            units.append(_Unit(gi, (c,) * min(per_gi, count)))
            count -= per_gi
    return units


def _shape(gi: GpuInstance) -> tuple[str, tuple[int, ...]]:
    return gi.profile, tuple(sorted(ci.slices for ci in gi.compute_instances))


def _keep(existing: Sequence[GpuInstance], units: list[_Unit]) -> tuple[list[GpuInstance], list[_Unit]]:
    """Existing GPU instances that already are one of the wanted units stay as they are."""
    rest, kept = list(units), []
    for gi in sorted(existing, key=lambda g: g.placement):
        match = next((i for i, u in enumerate(rest) if u.shape == _shape(gi)), None)
        if match is not None:
            kept.append(gi)
            rest.pop(match)
    return kept, rest


def _fit(units: list[_Unit], occupied: list[Placement],
         profiles: Mapping[str, GiProfile]) -> list[tuple[_Unit, Placement]] | None:
    """Placements for every unit (largest first, backtracking over each profile's possible placements)."""
    slots = {p for prof in profiles.values() for p in prof.placements}
    total_slices = max((prof.slices for prof in profiles.values()), default=0)
    total_memory = max((p.start + p.size for p in slots), default=0)
    used_mem = sum(p.size for p in occupied)
    if sum(u.gi.slices for u in units) > total_slices or \
            used_mem + sum(min(p.size for p in u.gi.placements) for u in units if u.gi.placements) > total_memory:
        return None
    order = sorted(units, key=lambda u: (-u.gi.slices, -u.gi.memory_mib, u.gi.name, u.cis))

    def place(i: int, taken: list[Placement], floor: Placement | None) -> list[Placement] | None:
        if i == len(order):
            return []
        for p in sorted(order[i].gi.placements):
            if (floor and p <= floor) or any(p.overlaps(t) for t in taken):
                continue  # identical units take increasing placements: no permutation is tried twice
            nxt = order[i + 1] if i + 1 < len(order) else None
            rest = place(i + 1, [*taken, p], p if nxt == order[i] else None)
            if rest is not None:
                return [p, *rest]
        return None

    found = place(0, list(occupied), None)
    return None if found is None else list(zip(order, found, strict=True))


def _destroy_ops(gi: GpuInstance) -> list[MigOp]:
    ops = [MigOp("destroy_ci", ci.profile, gi_id=gi.id, ci_id=ci.id) for ci in gi.compute_instances]
    return ops + [MigOp("destroy_gi", gi.profile, gi_id=gi.id, placement=gi.placement)]


def _create_ops(profile: str, profile_id: int, gi_slices: int, placement: Placement,
                cis: Iterable[tuple[int, Placement | None]]) -> list[MigOp]:
    ops = [MigOp("create_gi", profile, profile_id=profile_id, placement=placement)]
    for slices, at in cis:
        ops.append(MigOp("create_ci", ci_name(profile, gi_slices, slices), slices=slices, placement=at,
                         gi_start=placement.start, gi_profile=profile))
    return ops


def plan_layout(state: MigState, target: Mapping[str, int], profiles: Mapping[str, GiProfile]) -> list[MigOp]:
    """The ordered ops that turn `state` into `target`; empty when the layout already matches. GPU instances that
    already are part of the target are kept; when the rest does not fit around them, everything is recreated."""
    want = normalize_target(target)
    if state.mode_current and layout_of(state) == want:
        return []
    units = _units(want, profiles)
    existing = list(state.gpu_instances) if state.mode_current else []
    kept, rest = _keep(existing, units)
    placed = _fit(rest, [g.placement for g in kept], profiles)
    if placed is None and kept:
        kept, placed = [], _fit(units, [], profiles)
    if placed is None:
        need = sum(u.gi.slices for u in units)
        raise MigPlanError(f"layout {format_layout(want)} does not fit on this GPU ({need} compute slices wanted; "
                           "no combination of the profiles' placements holds them all)")
    ops = [] if state.mode_current else [MigOp("enable_mig")]
    for gi in existing:
        if gi not in kept:
            ops += _destroy_ops(gi)
    for unit, at in sorted(placed, key=lambda x: x[1]):
        ops += _create_ops(unit.gi.name, unit.gi.profile_id, unit.gi.slices, at, ((c, None) for c in unit.cis))
    return ops


# ---------------------------------------------------------------- execution


def _set_mode(backend: MigBackend, device: int | str, enabled: bool) -> None:
    backend.set_mode(device, enabled)
    now = backend.read_state(device)
    word = "enable" if enabled else "disable"
    if now.mode_pending != enabled:
        raise MigError(f"{word} MIG mode: the driver accepted the call but the mode did not change")
    if now.mode_current != enabled:
        raise MigError(f"MIG mode is pending {word}: this GPU needs a GPU reset for it to take effect "
                       "(nvidia-smi -r); chaoskit does not reset GPUs")


def execute(backend: MigBackend, device: int | str, ops: Sequence[MigOp], state: MigState) -> None:
    """Run ops in order; a failing call raises MigError naming the op (what ran before it stays done)."""
    gi_ids = {gi.placement.start: gi.id for gi in state.gpu_instances}
    for op in ops:
        try:
            if op.action in ("enable_mig", "disable_mig"):
                _set_mode(backend, device, op.action == "enable_mig")
            elif op.action == "destroy_ci":
                backend.destroy_ci(device, op.gi_id, op.ci_id)  # type: ignore[arg-type]
            elif op.action == "destroy_gi":
                backend.destroy_gi(device, op.gi_id)  # type: ignore[arg-type]
            elif op.action == "create_gi":
                gi_ids[op.placement.start] = backend.create_gi(device, op.profile_id, op.placement)  # type: ignore
            elif op.action == "create_ci":
                backend.create_ci(device, gi_ids[op.gi_start], op.slices, op.placement)  # type: ignore[arg-type]
            else:
                raise MigError(f"unknown MIG operation {op.action!r}")
        except MigError:
            raise
        except Exception as e:
            raise MigError(f"{op.describe()}: {type(e).__name__}: {e}") from e


def apply_layout(backend: MigBackend, device: int | str, target: Mapping[str, int],
                 enable_mig: bool = False) -> MigState:
    """Make the layout `target`; re-read and raise unless the device now has exactly that layout. An already
    matching layout returns the state unchanged (no calls made)."""
    want = normalize_target(target)
    state = backend.read_state(device)
    if not state.mode_current:
        if not enable_mig:
            raise MigError(f"MIG mode is off on {state.uuid}; set enable_mig: true to turn it on")
        _set_mode(backend, device, True)
        state = backend.read_state(device)
    ops = plan_layout(state, want, backend.profiles(device))
    if not ops:
        return state
    execute(backend, device, ops, state)
    now = backend.read_state(device)
    got = layout_of(now)
    if got != want:
        raise MigError(f"after {len(ops)} MIG operations the layout is {format_layout(got)}, not the target "
                       f"{format_layout(want)}: the driver accepted the calls but the change did not happen")
    return now


# ---------------------------------------------------------------- checkpoint restore and comparison


def _gi_key(gi: GpuInstance) -> tuple[Any, ...]:
    cis = sorted((ci.placement, ci.profile_id, ci.profile, ci.slices) for ci in gi.compute_instances)
    return gi.placement, gi.profile_id, gi.profile, gi.slices, tuple(cis)


def same_state(a: MigState, b: MigState) -> bool:
    """Full-state equality (mode, GPU and compute instances with placements), instance ids aside."""
    return (a.uuid, a.mode_current, a.mode_pending) == (b.uuid, b.mode_current, b.mode_pending) and \
        sorted(map(_gi_key, a.gpu_instances)) == sorted(map(_gi_key, b.gpu_instances))


def plan_restore(now: MigState, checkpoint: MigState) -> list[MigOp]:
    """Ops from `now` back to `checkpoint`: identical GPU instances stay, the rest is destroyed and recreated at
    the checkpoint's exact placements (compute instances too); the mode is restored when it differs."""
    if same_state(now, checkpoint):
        return []
    mode_differs = (now.mode_current, now.mode_pending) != (checkpoint.mode_current, checkpoint.mode_pending)
    keep = set() if mode_differs else {_gi_key(g) for g in checkpoint.gpu_instances}
    have = {_gi_key(g) for g in now.gpu_instances if _gi_key(g) in keep}
    ops: list[MigOp] = []
    for gi in now.gpu_instances if now.mode_current else ():
        if _gi_key(gi) not in keep:
            ops += _destroy_ops(gi)
    if mode_differs:
        ops.append(MigOp("enable_mig" if checkpoint.mode_pending else "disable_mig"))
    for gi in sorted(checkpoint.gpu_instances, key=lambda g: g.placement) if checkpoint.mode_current else ():
        if _gi_key(gi) not in have:
            cis = sorted(gi.compute_instances, key=lambda c: c.placement)
            ops += _create_ops(gi.profile, gi.profile_id, gi.slices, gi.placement,
                               ((c.slices, c.placement) for c in cis))
    return ops


def restore(backend: MigBackend, device: int | str, checkpoint: MigState) -> list[MigOp]:
    """Bring the device back to the checkpoint; returns the ops run (none when it already is). The caller
    checks the result with assert_equal."""
    now = backend.read_state(device)
    ops = plan_restore(now, checkpoint)
    execute(backend, device, ops, now)
    return ops


def _mode(s: MigState) -> str:
    return f"current={'enabled' if s.mode_current else 'disabled'} pending={'enabled' if s.mode_pending else 'disabled'}"


def _ci_text(ci: ComputeInstance) -> str:
    return f"compute instance {ci.profile} (profile id {ci.profile_id}) at {ci.placement}"


def _gi_diff(a: GpuInstance, b: GpuInstance) -> list[str]:
    where = f"GPU instance {a.profile} at {a.placement}"
    if (a.profile, a.profile_id, a.slices) != (b.profile, b.profile_id, b.slices):
        return [f"{where}: checkpoint profile {a.profile} (id {a.profile_id}), now {b.profile} (id {b.profile_id})"]
    out = []
    ca = {c.placement: c for c in a.compute_instances}
    cb = {c.placement: c for c in b.compute_instances}
    for p in sorted(set(ca) | set(cb)):
        x, y = ca.get(p), cb.get(p)
        if y is None:
            out.append(f"{where}: {_ci_text(x)} is in the checkpoint, missing now")  # type: ignore[arg-type]
        elif x is None:
            out.append(f"{where}: {_ci_text(y)} is not in the checkpoint, present now")
        elif (x.profile, x.profile_id, x.slices) != (y.profile, y.profile_id, y.slices):
            out.append(f"{where}: checkpoint {_ci_text(x)}, now {_ci_text(y)}")
    return out


def differences(checkpoint: MigState, now: MigState) -> list[str]:
    out = []
    if checkpoint.uuid != now.uuid:
        out.append(f"device: checkpoint {checkpoint.uuid}, now {now.uuid}")
    if (checkpoint.mode_current, checkpoint.mode_pending) != (now.mode_current, now.mode_pending):
        out.append(f"MIG mode: checkpoint {_mode(checkpoint)}, now {_mode(now)}")
    ga = {g.placement: g for g in checkpoint.gpu_instances}
    gb = {g.placement: g for g in now.gpu_instances}
    for p in sorted(set(ga) | set(gb)):
        a, b = ga.get(p), gb.get(p)
        if b is None:
            out.append(f"GPU instance {a.profile} at {p} is in the checkpoint, missing now")  # type: ignore[union-attr]
        elif a is None:
            out.append(f"GPU instance {b.profile} at {p} is not in the checkpoint, present now")
        else:
            out += _gi_diff(a, b)
    return out


def assert_equal(checkpoint: MigState, now: MigState) -> None:
    """Raise MigMismatch listing every difference (mode, GPU instances, compute instances, placements)."""
    if not same_state(checkpoint, now):
        raise MigMismatch(differences(checkpoint, now) or ["(no difference found by field, but states differ)"])


__all__ = [
    "ComputeInstance", "ComputeProcess", "DeviceFacts", "GiProfile", "GpuInstance", "MigBackend", "MigError",
    "MigMismatch", "MigOp", "MigPlanError", "MigState", "Placement", "apply_layout", "assert_equal", "differences",
    "execute", "format_layout", "from_json", "layout_of", "normalize_target", "parse_profile", "plan_layout",
    "plan_restore", "restore", "same_state", "to_json",
]
