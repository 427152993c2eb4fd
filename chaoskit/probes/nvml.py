"""nvml probe: one GPU's memory, utilisation, temperature, power, ECC, MIG state, processes and XID events."""

from __future__ import annotations

import asyncio
from typing import Any, ClassVar, Literal

from pydantic import Field, field_validator

from chaoskit.errors import PreflightError
from chaoskit.gpu import nvml
from chaoskit.probes.base import Probe, ProbeSpecBase


class NvmlProbeSpec(ProbeSpecBase):
    type: Literal["nvml"]
    device: int | str = Field(0, description="GPU index, GPU-/MIG- UUID or PCI bus id")
    expect_keys: ClassVar[tuple[str, ...]] = (
        "memory_total", "memory_used", "memory_free", "memory_used_share", "utilization_gpu", "utilization_memory",
        "temperature_c", "power_w", "ecc_corrected", "ecc_uncorrected", "mig_enabled", "mig_devices", "processes",
        "process_memory.", "xid_events", "last_xid")

    @field_validator("device")
    @classmethod
    def _device(cls, v: int | str) -> int | str:
        return nvml.parse_device(v)


class NvmlProbe(Probe):
    type: ClassVar[str] = "nvml"
    host_needs: ClassVar[frozenset[str]] = frozenset({"nvml"})
    summary: ClassVar[str] = ("a GPU through NVML: memory used/free, utilisation, temperature, power, ECC, MIG, "
                              "per-process memory, XID events in the window")
    Spec = NvmlProbeSpec
    spec: NvmlProbeSpec

    def __init__(self, spec: NvmlProbeSpec):
        super().__init__(spec)
        self._nv: Any = None
        self._handle: Any = None
        self._events: Any = None

    def preflight(self) -> None:
        self._nv = nvml.module()
        try:
            self._nv.nvmlInit()
        except Exception as e:
            self._nv = None
            raise PreflightError(f"nvml: no NVML: {nvml.error_text(e)}") from None
        try:
            self._handle = nvml.handle(self._nv, self.spec.device)
        except PreflightError as e:
            self._shutdown()
            raise PreflightError(f"nvml: {e}") from None
        self._events = self._register_xid()

    def _register_xid(self) -> Any:
        """An NVML event set for XID critical errors on this device (None where the device cannot give them)."""
        nv = self._nv
        try:
            es = nv.nvmlEventSetCreate()
            nv.nvmlDeviceRegisterEvents(self._handle, nv.nvmlEventTypeXidCriticalError, es)
            return es
        except Exception:
            return None

    def _drain_xids(self) -> tuple[int | None, int | None]:
        if self._events is None:
            return None, None
        n, last = 0, None
        while True:
            try:
                data = self._nv.nvmlEventSetWait_v2(self._events, 0)
            except Exception:  # NVML_ERROR_TIMEOUT: nothing more pending
                return n, last
            n, last = n + 1, int(data.eventData)

    def _measure(self) -> dict[str, Any]:
        if self._nv is None:
            self.preflight()
        values = nvml.sample(self._nv, self._handle).values()
        values["xid_events"], values["last_xid"] = self._drain_xids()
        return values

    async def measure(self) -> dict[str, Any]:
        return await asyncio.to_thread(self._measure)

    def _shutdown(self) -> None:
        if self._nv is not None:
            if self._events is not None:
                try:
                    self._nv.nvmlEventSetFree(self._events)
                except Exception:
                    pass
            try:
                self._nv.nvmlShutdown()
            except Exception:
                pass
        self._nv = self._handle = self._events = None

    async def close(self) -> None:
        self._shutdown()
