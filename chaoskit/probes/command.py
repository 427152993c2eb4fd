"""command probe: run an argv (no shell) and judge its exit code, stdout and duration."""

from __future__ import annotations

import asyncio
import os
import time
from typing import Any, ClassVar, Literal

from pydantic import Field

from chaoskit.probes.base import Probe, ProbeSpecBase


class CommandProbeSpec(ProbeSpecBase):
    type: Literal["command"]
    argv: list[str] = Field(min_length=1, description="program and arguments; never run through a shell")
    env: dict[str, str] = Field(default_factory=dict, description="extra environment variables")
    expect_keys: ClassVar[tuple[str, ...]] = ("exit_code", "stdout", "stderr", "stdout_number", "duration_ms")


class CommandProbe(Probe):
    type: ClassVar[str] = "command"
    summary: ClassVar[str] = "run a program (argv list, no shell): exit code, stdout, duration"
    Spec = CommandProbeSpec
    spec: CommandProbeSpec

    async def measure(self) -> dict[str, Any]:
        t0 = time.perf_counter()
        proc = await asyncio.create_subprocess_exec(
            *self.spec.argv, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE, env={**os.environ, **self.spec.env},
        )
        try:
            async with asyncio.timeout(self.spec.timeout):
                out, err = await proc.communicate()
        except (TimeoutError, asyncio.CancelledError):
            proc.kill()
            await proc.wait()
            raise
        stdout = out.decode(errors="replace").strip()
        result: dict[str, Any] = {
            "exit_code": proc.returncode,
            "stdout": stdout[:4096],
            "stderr": err.decode(errors="replace").strip()[:4096],
            "duration_ms": round((time.perf_counter() - t0) * 1000, 3),
        }
        try:
            result["stdout_number"] = float(stdout)
        except ValueError:
            result["stdout_number"] = None
        return result
