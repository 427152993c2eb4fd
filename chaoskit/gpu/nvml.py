"""The one place chaoskit calls NVML (pynvml) for device facts: lookup by index/UUID/PCI id, memory, health.

Everything returns plain dataclasses; a missing NVML library or device is a PreflightError with one line.
MIG state and reconfiguration calls live in mig_nvml.py.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from typing import Any

from chaoskit.errors import PreflightError

_PCI_RE = re.compile(r"^([0-9a-fA-F]{4,8}:)?[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7]$")


_UUID_RE = re.compile(r"^(GPU|MIG)-[0-9A-Fa-f][0-9A-Fa-f\-/]*$")


def parse_device(value: int | str, pci: bool = True) -> int | str:
    """A device as the spec gives it: an index (int or digits), a GPU-/MIG- UUID, or (with `pci`) a PCI bus id.
    ValueError otherwise (a spec error at validation)."""
    if isinstance(value, str) and value.strip().isdigit():
        value = int(value)
    if isinstance(value, int):
        if value < 0:
            raise ValueError("device index must be >= 0")
        return value
    if _UUID_RE.match(value) or (pci and _PCI_RE.match(value)):
        return value
    raise ValueError(f"expected a GPU index, GPU-/MIG- UUID{' or PCI bus id' if pci else ''} (got {value!r})")


def module() -> Any:
    try:
        import pynvml
    except ImportError as e:  # nvidia-ml-py is a dependency; this is a broken install
        raise PreflightError(f"no NVML: python module pynvml missing ({e})") from None
    return pynvml


@contextmanager
def session() -> Iterator[Any]:
    """nvmlInit ... nvmlShutdown; yields the pynvml module. No driver -> PreflightError('no NVML: ...')."""
    nv = module()
    try:
        nv.nvmlInit()
    except Exception as e:  # NVMLError_LibraryNotFound, DriverNotLoaded ...
        raise PreflightError(f"no NVML: {error_text(e)}") from None
    try:
        yield nv
    finally:
        try:
            nv.nvmlShutdown()
        except Exception:
            pass


def error_text(e: Exception) -> str:
    text = str(e) or type(e).__name__
    return text.decode() if isinstance(text, bytes) else text


def _s(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def handle(nv: Any, device: int | str) -> Any:
    """A device handle for an index, a GPU-/MIG- UUID or a PCI bus id; PreflightError('no device ...')."""
    try:
        if isinstance(device, int) or str(device).isdigit():
            return nv.nvmlDeviceGetHandleByIndex(int(device))
        if _PCI_RE.match(str(device)):
            return nv.nvmlDeviceGetHandleByPciBusId(str(device))
        return nv.nvmlDeviceGetHandleByUUID(str(device))
    except Exception as e:
        count = _safe(lambda: nv.nvmlDeviceGetCount(), "?")
        raise PreflightError(f"no device {device} ({count} GPU(s) visible to NVML: {error_text(e)})") from None


def _safe(fn: Any, default: Any = None) -> Any:
    """Optional NVML fields (power, ECC on consumer cards) are None where the device does not support them."""
    try:
        return fn()
    except Exception:
        return default


@dataclass(frozen=True)
class DeviceInfo:
    index: int
    name: str
    uuid: str
    pci_bus_id: str
    memory_total: int
    mig_capable: bool
    mig_current: bool | None
    mig_pending: bool | None


def _mig_mode(nv: Any, h: Any) -> tuple[bool, bool | None, bool | None]:
    try:
        cur, pend = nv.nvmlDeviceGetMigMode(h)
    except Exception:
        return False, None, None  # NVML_ERROR_NOT_SUPPORTED: not MIG-capable
    return True, bool(cur), bool(pend)


def device_info(nv: Any, h: Any, index: int) -> DeviceInfo:
    capable, cur, pend = _mig_mode(nv, h)
    return DeviceInfo(index=index, name=_s(nv.nvmlDeviceGetName(h)), uuid=_s(nv.nvmlDeviceGetUUID(h)),
                      pci_bus_id=_s(nv.nvmlDeviceGetPciInfo(h).busId),
                      memory_total=int(nv.nvmlDeviceGetMemoryInfo(h).total), mig_capable=capable,
                      mig_current=cur, mig_pending=pend)


def devices() -> list[DeviceInfo]:
    """Every GPU NVML sees (PreflightError when NVML is absent)."""
    with session() as nv:
        return [device_info(nv, nv.nvmlDeviceGetHandleByIndex(i), i) for i in range(nv.nvmlDeviceGetCount())]


def uuid_of_minor(minor: int) -> str:
    """The UUID of the GPU whose device node is /dev/nvidia<minor> (PreflightError if NVML knows none)."""
    with session() as nv:
        count = nv.nvmlDeviceGetCount()
        for i in range(count):
            h = nv.nvmlDeviceGetHandleByIndex(i)
            if _safe(lambda h=h: nv.nvmlDeviceGetMinorNumber(h)) == minor:
                return _s(nv.nvmlDeviceGetUUID(h))
    raise PreflightError(f"no GPU has device node /dev/nvidia{minor} ({count} GPU(s) visible to NVML)")


@dataclass(frozen=True)
class MemoryInfo:
    total: int
    used: int
    free: int


def memory(device: int | str) -> MemoryInfo:
    with session() as nv:
        m = nv.nvmlDeviceGetMemoryInfo(handle(nv, device))
        return MemoryInfo(int(m.total), int(m.used), int(m.free))


@dataclass
class DeviceSample:
    """One reading of a device, flattened into probe values by `values()`."""

    memory_total: int
    memory_used: int
    memory_free: int
    utilization_gpu: float | None
    utilization_memory: float | None
    temperature_c: float | None
    power_w: float | None
    ecc_corrected: int | None
    ecc_uncorrected: int | None
    mig_enabled: bool | None
    mig_devices: int
    processes: dict[int, int] = field(default_factory=dict)  # pid -> used bytes

    def values(self) -> dict[str, Any]:
        out = asdict(self)
        out["memory_used_share"] = self.memory_used / self.memory_total if self.memory_total else None
        out["processes"] = len(self.processes)
        out["process_memory"] = {str(k): v for k, v in self.processes.items()}
        return out


def sample(nv: Any, h: Any) -> DeviceSample:
    m = nv.nvmlDeviceGetMemoryInfo(h)
    util = _safe(lambda: nv.nvmlDeviceGetUtilizationRates(h))
    _, mig_cur, _ = _mig_mode(nv, h)
    procs = _safe(lambda: nv.nvmlDeviceGetComputeRunningProcesses(h), []) or []

    def ecc(kind: int) -> int | None:
        return _safe(lambda: int(nv.nvmlDeviceGetTotalEccErrors(h, kind, nv.NVML_VOLATILE_ECC)))

    return DeviceSample(
        memory_total=int(m.total), memory_used=int(m.used), memory_free=int(m.free),
        utilization_gpu=float(util.gpu) if util else None, utilization_memory=float(util.memory) if util else None,
        temperature_c=_safe(lambda: float(nv.nvmlDeviceGetTemperature(h, nv.NVML_TEMPERATURE_GPU))),
        power_w=_safe(lambda: nv.nvmlDeviceGetPowerUsage(h) / 1000.0),
        ecc_corrected=ecc(nv.NVML_MEMORY_ERROR_TYPE_CORRECTED),
        ecc_uncorrected=ecc(nv.NVML_MEMORY_ERROR_TYPE_UNCORRECTED),
        mig_enabled=mig_cur, mig_devices=_mig_device_count(nv, h) if mig_cur else 0,
        processes={int(p.pid): int(p.usedGpuMemory or 0) for p in procs},
    )


def _mig_device_count(nv: Any, h: Any) -> int:
    n = 0
    for i in range(_safe(lambda: nv.nvmlDeviceGetMaxMigDeviceCount(h), 0)):
        if _safe(lambda i=i: nv.nvmlDeviceGetMigDeviceHandleByIndex(h, i)) is not None:
            n += 1
    return n
