"""Take one sample of a probe (with its timeout) and judge it against the probe's tolerances."""

from __future__ import annotations

import asyncio
import time
from dataclasses import asdict, dataclass, field
from typing import Any

from chaoskit.probes.base import Probe


@dataclass
class Sample:
    probe: str
    phase: str
    t: float
    verdict: str  # ok | fail | error
    values: dict[str, Any] = field(default_factory=dict)
    details: list[str] = field(default_factory=list)
    error: str | None = None
    duration_ms: float = 0.0

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


async def take_sample(probe: Probe, phase: str) -> Sample:
    """Never raises (except cancellation): exceptions and timeouts become `error` samples."""
    spec = probe.spec
    t, t0 = time.time(), time.perf_counter()
    try:
        # asyncio.timeout, not wait_for: 3.11's wait_for returns an answer that lands in the same tick as a
        # cancel and drops the cancel, so a stopped sampler went on sampling and the run never ended
        async with asyncio.timeout(spec.timeout):
            values = await probe.measure()
    except TimeoutError:
        return Sample(spec.name, phase, t, "error", error=f"timed out after {spec.timeout:g}s",
                      duration_ms=_ms(t0))
    except asyncio.CancelledError:
        raise
    except Exception as e:
        return Sample(spec.name, phase, t, "error", error=f"{type(e).__name__}: {e}".strip(),
                      duration_ms=_ms(t0))
    expect = spec.flat_expect()
    details, ok = [], True
    for key, tol in expect.items():
        if key not in values:
            ok = False
            details.append(f"{key}: not measured")
            continue
        passed, why = tol.check(values[key])
        ok = ok and passed
        details.append(f"{key}: {why}")
    kept = {k: (v[:200] if isinstance(v, str) else v) for k, v in values.items()}
    return Sample(spec.name, phase, t, "ok" if ok else "fail", kept, details, duration_ms=_ms(t0))


def _ms(t0: float) -> float:
    return round((time.perf_counter() - t0) * 1000, 3)
