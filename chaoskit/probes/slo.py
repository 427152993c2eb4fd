"""slo probe: drive open-loop load (chaoskit.load) and judge its latency percentiles, errors and goodput.

Two modes: `window` (each sample runs a fresh load of `load.duration`) and `continuous` (load runs from the
first sample to the end of the run; each sample reports what completed since the previous one, so a
deviation shows within one interval)."""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from pydantic import Field, model_validator

from chaoskit.load.runner import ContinuousLoad, run_load
from chaoskit.load.spec import LoadSpec
from chaoskit.probes.base import Probe, ProbeSpecBase
from chaoskit.spec.types import Duration

_PCT = ("p50_ms", "p90_ms", "p99_ms", "p999_ms")
_KEYS = (*_PCT, *(f"{m}_{p}" for m in ("service", "ttft", "itl", "tpot") for p in _PCT),
         "error_rate", "goodput_rps", "achieved_rps", "requested_rps", "achieved_ratio", "late_sends", "late_share",
         "sent", "ok", "output_tokens")


class SloProbeSpec(ProbeSpecBase):
    type: Literal["slo"]
    load: LoadSpec = Field(description="the load the SLO is stated under (url, api, rate, duration, ...)")
    mode: Literal["window", "continuous"] = Field("window", description="continuous: load runs for the whole "
                                                                        "experiment, samples report each interval")
    window: Duration = Field(2.0, gt=0, description="continuous: reporting window")
    timeout: Duration | None = Field(None, description="default: load duration (or window) + load timeout + 10s")
    expect_keys: ClassVar[tuple[str, ...]] = _KEYS

    @model_validator(mode="after")
    def _timeout(self) -> SloProbeSpec:
        if self.timeout is None:
            span = self.window if self.mode == "continuous" else self.load.duration
            object.__setattr__(self, "timeout", span + self.load.timeout + 10.0)
        return self


class SloProbe(Probe):
    type: ClassVar[str] = "slo"
    summary: ClassVar[str] = "open-loop load (CO-corrected) judged on p50..p99.9, errors, goodput, achieved rate"
    Spec = SloProbeSpec
    spec: SloProbeSpec

    def __init__(self, spec: SloProbeSpec):
        super().__init__(spec)
        self._continuous: ContinuousLoad | None = None

    async def measure(self) -> dict[str, Any]:
        if self.spec.mode == "window":
            summary = await run_load(self.spec.load)
            summary.pop("recorder", None)
        else:
            if self._continuous is None:
                self._continuous = ContinuousLoad(self.spec.load, self.spec.window)
                await self._continuous.start()
            summary = await self._continuous.window(timeout=self.spec.timeout or 60.0)
        summary["achieved_ratio"] = summary["achieved_rps"] / summary["requested_rps"]
        return summary

    async def close(self) -> None:
        if self._continuous is not None:
            await self._continuous.close()
            self._continuous = None
