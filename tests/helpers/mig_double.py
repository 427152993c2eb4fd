"""SimulatedMigGpu: an in-test double of one MIG GPU behind the MigBackend protocol (not NVML, not a real device).

Profile tables are those of the H100 80GB and H200 141GB (names, NVML profile ids as `nvidia-smi mig -lgip` shows
them, placements in memory slices as `-lgipp` shows them: 1g {0..6}:1, 1g double-memory {0,2,4,6}:2,
2g {0,2,4}:2, 3g {0,4}:4, 4g {0}:4, 7g {0}:8). Assumed, not measured here: compute-instance placements inside a
GPU instance start at multiples of the CI size (k-slice CIs at 0, k, 2k ... while they fit), memory sizes are
rounded, and the +me (media extension) profiles are left out.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import MappingProxyType

from chaoskit.errors import PreflightError
from chaoskit.gpu.mig import (
    ComputeInstance,
    ComputeProcess,
    DeviceFacts,
    GiProfile,
    GpuInstance,
    MigState,
    Placement,
    ci_name,
)


def _p(starts: tuple[int, ...], size: int) -> tuple[Placement, ...]:
    return tuple(Placement(s, size) for s in starts)


def h100_profiles() -> dict[str, GiProfile]:
    return {p.name: p for p in (
        GiProfile("1g.10gb", 19, 1, 9_856, _p((0, 1, 2, 3, 4, 5, 6), 1)),
        GiProfile("1g.20gb", 15, 1, 19_968, _p((0, 2, 4, 6), 2)),
        GiProfile("2g.20gb", 14, 2, 19_968, _p((0, 2, 4), 2)),
        GiProfile("3g.40gb", 9, 3, 40_192, _p((0, 4), 4)),
        GiProfile("4g.40gb", 5, 4, 40_192, _p((0,), 4)),
        GiProfile("7g.80gb", 0, 7, 80_384, _p((0,), 8)),
    )}


def h200_profiles() -> dict[str, GiProfile]:
    return {p.name: p for p in (
        GiProfile("1g.18gb", 19, 1, 16_384, _p((0, 1, 2, 3, 4, 5, 6), 1)),
        GiProfile("1g.35gb", 15, 1, 32_768, _p((0, 2, 4, 6), 2)),
        GiProfile("2g.35gb", 14, 2, 32_768, _p((0, 2, 4), 2)),
        GiProfile("3g.71gb", 9, 3, 65_536, _p((0, 4), 4)),
        GiProfile("4g.71gb", 5, 4, 65_536, _p((0,), 4)),
        GiProfile("7g.141gb", 0, 7, 131_072, _p((0,), 8)),
    )}


MODELS = MappingProxyType({"H100": ("NVIDIA H100 80GB HBM3", h100_profiles), "H200": ("NVIDIA H200", h200_profiles)})
CI_PROFILE_IDS = MappingProxyType({1: 0, 2: 1, 3: 2, 4: 3, 7: 4})  # NVML's compute-instance profile ids by slices


class SimulatedError(Exception):
    """What NVML would return as an error code (invalid argument, insufficient resources, in use ...)."""


@dataclass
class _Gi:
    profile: GiProfile
    placement: Placement
    cis: dict[int, tuple[int, Placement]] = field(default_factory=dict)  # ci id -> (slices, placement)


class SimulatedMigGpu:
    """A simulated GPU (index 0 or its UUID). Knobs: mig_capable, mode, needs_reset (Ampere-like: a mode change
    stays pending until reset()), processes, profiles_need_mig (NVML lists profiles only in MIG mode), and
    failure injection: drop_next(operation, n) makes the next n calls of an operation succeed without doing
    anything; `calls` logs every mutating call."""

    def __init__(self, model: str = "H200", *, mig_capable: bool = True, mode: bool = True, needs_reset: bool = False,
                 processes: list[ComputeProcess] | None = None, profiles_need_mig: bool = True,
                 uuid: str = "GPU-5171e0a7-0000-4000-8000-00000000c0de"):
        self.name, make = MODELS[model]
        self.table = make()
        self.uuid, self.mig_capable, self.needs_reset = uuid, mig_capable, needs_reset
        self.mode_current = self.mode_pending = mode and mig_capable
        self.processes = list(processes or [])
        self.profiles_need_mig = profiles_need_mig
        self.gis: dict[int, _Gi] = {}
        self.next_id = 1
        self.silent: dict[str, int] = {}
        self.calls: list[tuple] = []

    # ---- test knobs

    def drop_next(self, operation: str, n: int = 1) -> None:
        self.silent[operation] = self.silent.get(operation, 0) + n

    def reset(self) -> None:
        """A GPU reset: a pending MIG mode takes effect."""
        self.mode_current = self.mode_pending

    def _dropped(self, operation: str) -> bool:
        if self.silent.get(operation, 0) > 0:
            self.silent[operation] -= 1
            return True
        return False

    def _check(self, device: int | str) -> None:
        if device not in (0, "0", self.uuid):
            raise PreflightError(f"no device {device} (1 GPU(s) visible to the simulated NVML)")

    def _need_mig(self) -> None:
        if not self.mode_current:
            raise SimulatedError("NVML_ERROR_NOT_SUPPORTED: MIG mode is not enabled")

    def _new_id(self) -> int:
        self.next_id += 1
        return self.next_id

    # ---- MigBackend

    def describe(self, device: int | str) -> DeviceFacts:
        self._check(device)
        return DeviceFacts(self.uuid, self.name, self.mig_capable, self.needs_reset)

    def read_state(self, device: int | str) -> MigState:
        self._check(device)
        gis = []
        for gi_id, gi in self.gis.items():
            cis = tuple(sorted((ComputeInstance(ci_id, ci_name(gi.profile.name, gi.profile.slices, s),
                                                CI_PROFILE_IDS[s], s, p) for ci_id, (s, p) in gi.cis.items()),
                               key=lambda c: c.placement))
            gis.append(GpuInstance(gi_id, gi.profile.name, gi.profile.profile_id, gi.profile.slices, gi.placement,
                                   cis))
        return MigState(self.uuid, self.mode_current, self.mode_pending,
                        tuple(sorted(gis, key=lambda g: g.placement)))

    def profiles(self, device: int | str) -> dict[str, GiProfile]:
        self._check(device)
        if self.profiles_need_mig:
            self._need_mig()
        return dict(self.table)

    def set_mode(self, device: int | str, enabled: bool) -> None:
        self._check(device)
        self.calls.append(("set_mode", enabled))
        if not self.mig_capable:
            raise SimulatedError("NVML_ERROR_NOT_SUPPORTED: not MIG-capable")
        if self.gis:
            raise SimulatedError("NVML_ERROR_IN_USE: MIG devices exist")
        if self._dropped("set_mode"):
            return
        self.mode_pending = enabled
        if not self.needs_reset:
            self.mode_current = enabled

    def create_gi(self, device: int | str, profile_id: int, placement: Placement) -> int:
        self._check(device)
        self._need_mig()
        self.calls.append(("create_gi", profile_id, placement))
        prof = next((p for p in self.table.values() if p.profile_id == profile_id), None)
        if prof is None or placement not in prof.placements:
            raise SimulatedError(f"NVML_ERROR_INVALID_ARGUMENT: profile {profile_id} placement {placement}")
        if any(placement.overlaps(g.placement) for g in self.gis.values()):
            raise SimulatedError(f"NVML_ERROR_INSUFFICIENT_RESOURCES: placement {placement} is taken")
        if self._dropped("create_gi"):
            return self._new_id()  # an id that names nothing
        gi_id = self._new_id()
        self.gis[gi_id] = _Gi(prof, placement)
        return gi_id

    def create_ci(self, device: int | str, gi_id: int, slices: int, placement: Placement | None) -> int:
        self._check(device)
        self.calls.append(("create_ci", gi_id, slices, placement))
        gi = self.gis.get(gi_id)
        if gi is None:
            raise SimulatedError(f"NVML_ERROR_NOT_FOUND: GPU instance {gi_id}")
        if slices not in CI_PROFILE_IDS or slices > gi.profile.slices:
            raise SimulatedError(f"NVML_ERROR_NOT_SUPPORTED: {slices}-slice CI in {gi.profile.name}")
        possible = [Placement(s, slices) for s in range(0, gi.profile.slices - slices + 1, slices)]
        free = [p for p in possible if not any(p.overlaps(q) for _, q in gi.cis.values())]
        if placement is not None and placement not in possible:
            raise SimulatedError(f"NVML_ERROR_INVALID_ARGUMENT: CI placement {placement}")
        at = placement if placement is not None else (free[0] if free else None)
        if at is None or at not in free:
            raise SimulatedError("NVML_ERROR_INSUFFICIENT_RESOURCES: no room for the compute instance")
        ci_id = self._new_id()
        if not self._dropped("create_ci"):
            gi.cis[ci_id] = (slices, at)
        return ci_id

    def destroy_ci(self, device: int | str, gi_id: int, ci_id: int) -> None:
        self._check(device)
        self.calls.append(("destroy_ci", gi_id, ci_id))
        if gi_id not in self.gis or ci_id not in self.gis[gi_id].cis:
            raise SimulatedError(f"NVML_ERROR_NOT_FOUND: compute instance {ci_id} in GPU instance {gi_id}")
        if not self._dropped("destroy_ci"):
            del self.gis[gi_id].cis[ci_id]

    def destroy_gi(self, device: int | str, gi_id: int) -> None:
        self._check(device)
        self.calls.append(("destroy_gi", gi_id))
        if gi_id not in self.gis:
            raise SimulatedError(f"NVML_ERROR_NOT_FOUND: GPU instance {gi_id}")
        if self.gis[gi_id].cis:
            raise SimulatedError(f"NVML_ERROR_IN_USE: GPU instance {gi_id} still has compute instances")
        if not self._dropped("destroy_gi"):
            del self.gis[gi_id]

    def compute_processes(self, device: int | str) -> list[ComputeProcess]:
        self._check(device)
        return list(self.processes)

    def mutations(self) -> int:
        return len(self.calls)

