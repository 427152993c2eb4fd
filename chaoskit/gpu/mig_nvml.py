"""The thin NVML (pynvml) backend of gpu.mig: reads MIG state and profiles, creates and destroys instances.

Every method opens its own NVML session (chaoskit.gpu.nvml.session) and resolves the device with handle(); the
logic lives in chaoskit.gpu.mig. Not exercised on machines without a GPU.
"""

from __future__ import annotations

import ctypes
from typing import Any

from chaoskit.gpu import nvml
from chaoskit.gpu.mig import ComputeInstance, ComputeProcess, DeviceFacts, GiProfile, GpuInstance, MigState, Placement

_CI_PROFILE_BY_SLICES = ((1, "NVML_COMPUTE_INSTANCE_PROFILE_1_SLICE"), (2, "NVML_COMPUTE_INSTANCE_PROFILE_2_SLICE"),
                         (3, "NVML_COMPUTE_INSTANCE_PROFILE_3_SLICE"), (4, "NVML_COMPUTE_INSTANCE_PROFILE_4_SLICE"),
                         (6, "NVML_COMPUTE_INSTANCE_PROFILE_6_SLICE"), (7, "NVML_COMPUTE_INSTANCE_PROFILE_7_SLICE"),
                         (8, "NVML_COMPUTE_INSTANCE_PROFILE_8_SLICE"))


def _text(v: Any) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


def _gi_profile_name(info: Any, total_memory: int) -> str:
    """NVML's own name ('MIG 1g.18gb' -> '1g.18gb'); else mig-parted's rounding of the memory share."""
    name = _text(getattr(info, "name", b"")).removeprefix("MIG ").strip()
    if name:
        return name
    share = -(-(info.memorySizeMB << 20) * 8 // total_memory) / 8  # ceil to 1/8 of the device memory
    return f"{info.sliceCount}g.{round(share * -(-total_memory // (1 << 30)))}gb"


def _gi_infos(nv: Any, h: Any) -> list[Any]:
    """Profile infos of every GPU instance profile the device supports, once per profile id."""
    seen, out = set(), []
    for p in range(nv.NVML_GPU_INSTANCE_PROFILE_COUNT):
        try:
            info = nv.nvmlDeviceGetGpuInstanceProfileInfo(h, p)
        except nv.NVMLError:
            continue
        if info.id not in seen:
            seen.add(info.id)
            out.append(info)
    return out


def _ci_infos(nv: Any, gi: Any) -> list[Any]:
    seen, out = set(), []
    for p in range(nv.NVML_COMPUTE_INSTANCE_PROFILE_COUNT):
        try:
            info = nv.nvmlGpuInstanceGetComputeInstanceProfileInfo(gi, p, nv.NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED)
        except nv.NVMLError:
            continue
        if info.id not in seen:
            seen.add(info.id)
            out.append(info)
    return out


def _gpu_instances(nv: Any, h: Any, info: Any) -> list[Any]:
    arr = (nv.c_nvmlGpuInstance_t * max(info.instanceCount, 1))()
    count = ctypes.c_uint(0)
    nv.nvmlDeviceGetGpuInstances(h, info.id, arr, ctypes.byref(count))
    return list(arr[:count.value])


def _compute_instances(nv: Any, gi: Any, info: Any) -> list[Any]:
    arr = (nv.c_nvmlComputeInstance_t * max(info.instanceCount, 1))()
    count = ctypes.c_uint(0)
    nv.nvmlGpuInstanceGetComputeInstances(gi, info.id, arr, ctypes.byref(count))
    return list(arr[:count.value])


def _placements(nv: Any, h: Any, profile_id: int) -> tuple[Placement, ...]:
    count = ctypes.c_uint(0)
    nv.nvmlDeviceGetGpuInstancePossiblePlacements(h, profile_id, None, ctypes.byref(count))
    arr = (nv.c_nvmlGpuInstancePlacement_t * max(count.value, 1))()
    nv.nvmlDeviceGetGpuInstancePossiblePlacements(h, profile_id, arr, ctypes.byref(count))
    return tuple(Placement(int(p.start), int(p.size)) for p in arr[:count.value])


def _read_gi(nv: Any, gi: Any, info: Any, name: str) -> GpuInstance:
    gi_info = nv.nvmlGpuInstanceGetInfo(gi)
    cis = []
    for ci_prof in _ci_infos(nv, gi):
        for ci in _compute_instances(nv, gi, ci_prof):
            ci_info = nv.nvmlComputeInstanceGetInfo(ci)
            ci_profile = name if ci_prof.sliceCount == info.sliceCount else f"{ci_prof.sliceCount}c.{name}"
            cis.append(ComputeInstance(int(ci_info.id), ci_profile, int(ci_prof.id), int(ci_prof.sliceCount),
                                       Placement(int(ci_info.placement.start), int(ci_info.placement.size))))
    return GpuInstance(int(gi_info.id), name, int(info.id), int(info.sliceCount),
                       Placement(int(gi_info.placement.start), int(gi_info.placement.size)),
                       tuple(sorted(cis, key=lambda c: c.placement)))


class NvmlMigBackend:
    """MigBackend over pynvml; device = index, GPU UUID or PCI bus id."""

    def describe(self, device: int | str) -> DeviceFacts:
        with nvml.session() as nv:
            h = nvml.handle(nv, device)
            try:
                nv.nvmlDeviceGetMigMode(h)
                capable = True
            except nv.NVMLError:
                capable = False
            try:
                arch = int(nv.nvmlDeviceGetArchitecture(h))
            except nv.NVMLError:
                arch = None
            needs_reset = arch is None or arch <= nv.NVML_DEVICE_ARCH_AMPERE  # unknown: assume it may need one
            return DeviceFacts(_text(nv.nvmlDeviceGetUUID(h)), _text(nv.nvmlDeviceGetName(h)), capable, needs_reset)

    def read_state(self, device: int | str) -> MigState:
        with nvml.session() as nv:
            h = nvml.handle(nv, device)
            uuid = _text(nv.nvmlDeviceGetUUID(h))
            try:
                current, pending = (bool(x) for x in nv.nvmlDeviceGetMigMode(h))
            except nv.NVMLError:
                return MigState(uuid, False, False)
            gis: list[GpuInstance] = []
            if current:
                total = int(nv.nvmlDeviceGetMemoryInfo(h).total)
                for info in _gi_infos(nv, h):
                    name = _gi_profile_name(info, total)
                    gis += [_read_gi(nv, gi, info, name) for gi in _gpu_instances(nv, h, info)]
            return MigState(uuid, current, pending, tuple(sorted(gis, key=lambda g: g.placement)))

    def profiles(self, device: int | str) -> dict[str, GiProfile]:
        with nvml.session() as nv:
            h = nvml.handle(nv, device)
            total = int(nv.nvmlDeviceGetMemoryInfo(h).total)
            out = {}
            for info in _gi_infos(nv, h):
                name = _gi_profile_name(info, total)
                out[name] = GiProfile(name, int(info.id), int(info.sliceCount), int(info.memorySizeMB),
                                      _placements(nv, h, info.id))
            return out

    def set_mode(self, device: int | str, enabled: bool) -> None:
        with nvml.session() as nv:
            mode = nv.NVML_DEVICE_MIG_ENABLE if enabled else nv.NVML_DEVICE_MIG_DISABLE
            nv.nvmlDeviceSetMigMode(nvml.handle(nv, device), mode)

    def create_gi(self, device: int | str, profile_id: int, placement: Placement) -> int:
        with nvml.session() as nv:
            p = nv.c_nvmlGpuInstancePlacement_t(placement.start, placement.size)
            gi = nv.nvmlDeviceCreateGpuInstanceWithPlacement(nvml.handle(nv, device), profile_id, ctypes.byref(p))
            return int(nv.nvmlGpuInstanceGetInfo(gi).id)

    def create_ci(self, device: int | str, gi_id: int, slices: int, placement: Placement | None) -> int:
        with nvml.session() as nv:
            gi = nv.nvmlDeviceGetGpuInstanceById(nvml.handle(nv, device), gi_id)
            enum = getattr(nv, dict(_CI_PROFILE_BY_SLICES)[slices])
            info = nv.nvmlGpuInstanceGetComputeInstanceProfileInfo(gi, enum, nv.NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED)
            if placement is None:
                ci = nv.nvmlGpuInstanceCreateComputeInstance(gi, info.id)
            else:
                p = nv.c_nvmlComputeInstancePlacement_t(placement.start, placement.size)
                ci = nv.nvmlGpuInstanceCreateComputeInstanceWithPlacement(gi, info.id, ctypes.byref(p))
            return int(nv.nvmlComputeInstanceGetInfo(ci).id)

    def destroy_ci(self, device: int | str, gi_id: int, ci_id: int) -> None:
        with nvml.session() as nv:
            gi = nv.nvmlDeviceGetGpuInstanceById(nvml.handle(nv, device), gi_id)
            nv.nvmlComputeInstanceDestroy(nv.nvmlGpuInstanceGetComputeInstanceById(gi, ci_id))

    def destroy_gi(self, device: int | str, gi_id: int) -> None:
        with nvml.session() as nv:
            nv.nvmlGpuInstanceDestroy(nv.nvmlDeviceGetGpuInstanceById(nvml.handle(nv, device), gi_id))

    def compute_processes(self, device: int | str) -> list[ComputeProcess]:
        """Processes on the GPU and on each of its MIG devices."""
        with nvml.session() as nv:
            h = nvml.handle(nv, device)
            handles = [h]
            try:
                for i in range(nv.nvmlDeviceGetMaxMigDeviceCount(h)):
                    try:
                        handles.append(nv.nvmlDeviceGetMigDeviceHandleByIndex(h, i))
                    except nv.NVMLError:
                        pass
            except nv.NVMLError:
                pass
            procs: dict[int, ComputeProcess] = {}
            for d in handles:
                try:
                    running = nv.nvmlDeviceGetComputeRunningProcesses(d)
                except nv.NVMLError:
                    continue
                for p in running:
                    try:
                        name = _text(nv.nvmlSystemGetProcessName(p.pid))
                    except nv.NVMLError:
                        name = "?"
                    procs.setdefault(int(p.pid), ComputeProcess(int(p.pid), name, p.usedGpuMemory))
            return sorted(procs.values(), key=lambda p: p.pid)
