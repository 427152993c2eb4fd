"""host.memory_pressure: a holder process allocates and touches N bytes of RAM; revert = it exits."""

from __future__ import annotations

import time
import uuid
from pathlib import Path
from typing import Any, ClassVar, Literal

from pydantic import Field, field_validator

from chaoskit.errors import PreflightError
from chaoskit.injectors import helper_proc
from chaoskit.spec.types import StrictModel
from chaoskit.spec.units import format_size, is_percent, parse_size

SAFE_SHARE_OF_AVAILABLE = 0.8


def meminfo() -> dict[str, int]:
    """/proc/meminfo in bytes."""
    out = {}
    for line in Path("/proc/meminfo").read_text().splitlines():
        key, _, rest = line.partition(":")
        parts = rest.split()
        if parts:
            out[key] = int(parts[0]) * (1024 if len(parts) > 1 else 1)
    return out


class MemoryPressureSpec(StrictModel):
    type: Literal["host.memory_pressure"]
    size: str | int = Field(description="bytes to hold: '512MiB', '2GiB' or a share of RAM like '40%'")
    allow_unsafe: bool = Field(False, description=f"allow more than {SAFE_SHARE_OF_AVAILABLE:.0%} of "
                                                  "currently available memory")

    @field_validator("size")
    @classmethod
    def _size(cls, v: str | int) -> str | int:
        n = parse_size(v, total=1 << 40)  # syntax and sign only; the host decides the rest
        if n <= 0:
            raise ValueError("size must be greater than 0")
        return v

    def nbytes(self) -> int:
        total = meminfo()["MemTotal"]
        return parse_size(self.size, total=total) if is_percent(self.size) else parse_size(self.size)


class MemoryPressure(helper_proc.HelperFault):
    type: ClassVar[str] = "host.memory_pressure"
    summary: ClassVar[str] = "hold N bytes of host RAM in a holder process (revert: it exits)"
    Spec = MemoryPressureSpec
    spec: MemoryPressureSpec

    def preflight(self) -> None:
        n, avail = self.spec.nbytes(), meminfo()["MemAvailable"]
        if n > SAFE_SHARE_OF_AVAILABLE * avail and not self.spec.allow_unsafe:
            raise PreflightError(
                f"host.memory_pressure: {format_size(n)} is more than {SAFE_SHARE_OF_AVAILABLE:.0%} of the "
                f"{format_size(avail)} available now; set allow_unsafe: true to force")

    def plan(self) -> list[str]:
        return [f"start a holder process that allocates and touches {format_size(self.spec.nbytes())} "
                f"of RAM; revert: SIGTERM the holder (it also exits by itself after "
                f"{self.max_lifetime_s:g}s)"]

    def prepare(self) -> dict[str, Any]:
        return {"token": f"chaoskit-holder-{uuid.uuid4().hex}", "bytes": self.spec.nbytes()}

    def apply(self, record: dict[str, Any]) -> dict[str, Any]:
        until = time.time() + self.max_lifetime_s
        ref = helper_proc.spawn("chaoskit.injectors.memory_holder", record["token"],
                                [str(record["bytes"]), f"{until:.3f}"],
                                f"memory holder for {format_size(record['bytes'])}")
        return {**record, "holder": ref.to_json()}
