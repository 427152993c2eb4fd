"""TEST DOUBLE: a stand-in for the pynvml module (no GPU, no NVML here) with one simulated H200.

It answers the calls chaoskit.gpu.nvml and the nvml probe make, with pynvml's names and return shapes,
and records every call so tests can check what the code asks NVML for.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any


class NVMLError(Exception):
    pass


@dataclass
class SimulatedNvml:
    total: int = 143771566080  # an H200's 141 GiB as NVML reports it
    used: int = 1 << 30
    mig: tuple[int, int] | None = (0, 0)  # (current, pending); None = not MIG-capable
    processes: dict[int, int] = field(default_factory=dict)
    xids: list[int] = field(default_factory=list)  # pending XID events
    calls: list[str] = field(default_factory=list)
    initialised: int = 0

    NVML_TEMPERATURE_GPU = 0
    NVML_VOLATILE_ECC = 0
    NVML_MEMORY_ERROR_TYPE_CORRECTED = 0
    NVML_MEMORY_ERROR_TYPE_UNCORRECTED = 1
    nvmlEventTypeXidCriticalError = 8

    def _c(self, name: str) -> None:
        self.calls.append(name)

    def nvmlInit(self) -> None:
        self._c("nvmlInit")
        self.initialised += 1

    def nvmlShutdown(self) -> None:
        self._c("nvmlShutdown")
        self.initialised -= 1

    def nvmlDeviceGetCount(self) -> int:
        return 1

    def nvmlDeviceGetHandleByIndex(self, i: int) -> str:
        self._c(f"byIndex({i})")
        if i != 0:
            raise NVMLError("Invalid Argument")
        return "h0"

    def nvmlDeviceGetHandleByUUID(self, uuid: str) -> str:
        self._c(f"byUUID({uuid})")
        if uuid != "GPU-11111111-2222-3333-4444-555555555555":
            raise NVMLError("Not Found")
        return "h0"

    def nvmlDeviceGetMinorNumber(self, h: str) -> int:
        self._c(f"minor({h})")
        return 3  # its device node: /dev/nvidia3

    def nvmlDeviceGetHandleByPciBusId(self, bus: str) -> str:
        self._c(f"byPci({bus})")
        return "h0"

    def nvmlDeviceGetName(self, h: str) -> str:
        return "NVIDIA H200 (simulated)"

    def nvmlDeviceGetUUID(self, h: str) -> str:
        return "GPU-11111111-2222-3333-4444-555555555555"

    def nvmlDeviceGetPciInfo(self, h: str) -> Any:
        return SimpleNamespace(busId=b"00000000:3B:00.0")

    def nvmlDeviceGetMemoryInfo(self, h: str) -> Any:
        return SimpleNamespace(total=self.total, used=self.used, free=self.total - self.used)

    def nvmlDeviceGetUtilizationRates(self, h: str) -> Any:
        return SimpleNamespace(gpu=37, memory=12)

    def nvmlDeviceGetTemperature(self, h: str, sensor: int) -> int:
        return 41

    def nvmlDeviceGetPowerUsage(self, h: str) -> int:
        return 123456  # mW

    def nvmlDeviceGetTotalEccErrors(self, h: str, kind: int, counter: int) -> int:
        return 0 if kind == self.NVML_MEMORY_ERROR_TYPE_UNCORRECTED else 3

    def nvmlDeviceGetMigMode(self, h: str) -> tuple[int, int]:
        if self.mig is None:
            raise NVMLError("Not Supported")
        return self.mig

    def nvmlDeviceGetMaxMigDeviceCount(self, h: str) -> int:
        return 7

    def nvmlDeviceGetMigDeviceHandleByIndex(self, h: str, i: int) -> str:
        if i >= 2:
            raise NVMLError("Not Found")
        return f"mig{i}"

    def nvmlDeviceGetComputeRunningProcesses(self, h: str) -> list[Any]:
        return [SimpleNamespace(pid=p, usedGpuMemory=b) for p, b in self.processes.items()]

    def nvmlEventSetCreate(self) -> str:
        self._c("eventSetCreate")
        return "es"

    def nvmlDeviceRegisterEvents(self, h: str, kinds: int, es: str) -> None:
        self._c(f"registerEvents({kinds})")

    def nvmlEventSetWait_v2(self, es: str, timeout_ms: int) -> Any:
        if not self.xids:
            raise NVMLError("Timeout")
        return SimpleNamespace(eventData=self.xids.pop(0), eventType=self.nvmlEventTypeXidCriticalError)

    def nvmlEventSetFree(self, es: str) -> None:
        self._c("eventSetFree")
