"""HDR histograms of one load run (microseconds), mergeable across worker processes, and the summary."""

from __future__ import annotations

import base64
from dataclasses import dataclass, field
from typing import Any

from hdrh.histogram import HdrHistogram

METRICS = ("e2e", "service", "ttft", "itl", "tpot")  # e2e/ttft from the intended send; service from the actual
LOWEST, HIGHEST, DIGITS = 1, 3_600_000_000, 3
LATE_US = 1000  # a send more than 1 ms after its intended time is late


def _hist() -> HdrHistogram:
    return HdrHistogram(LOWEST, HIGHEST, DIGITS)


def _us(seconds: float) -> int:
    return min(HIGHEST, max(LOWEST, round(seconds * 1e6)))


@dataclass
class Recorder:
    hists: dict[str, HdrHistogram] = field(default_factory=lambda: {m: _hist() for m in METRICS})
    sent: int = 0
    ok: int = 0
    good: int = 0  # met every SLO
    errors: dict[str, int] = field(default_factory=dict)
    late: int = 0
    max_late_us: int = 0
    tokens: int = 0

    def sent_at(self, lateness_s: float) -> None:
        self.sent += 1
        us = round(lateness_s * 1e6)
        if us > LATE_US:
            self.late += 1
        self.max_late_us = max(self.max_late_us, us)

    def success(self, e2e: float, service: float, ttft: float | None, itls: list[float], tokens: int,
                good: bool) -> None:
        self.ok += 1
        self.good += good
        self.tokens += tokens
        self.hists["e2e"].record_value(_us(e2e))
        self.hists["service"].record_value(_us(service))
        if ttft is not None:
            self.hists["ttft"].record_value(_us(ttft))
        for gap in itls:
            self.hists["itl"].record_value(_us(gap))
        if ttft is not None and tokens > 1:
            self.hists["tpot"].record_value(_us((e2e - ttft) / (tokens - 1)))

    def failure(self, kind: str) -> None:
        self.errors[kind] = self.errors.get(kind, 0) + 1

    def reset(self) -> None:
        """Start a new window (continuous probing reports per window)."""
        fresh = Recorder()
        self.__dict__.update(fresh.__dict__)

    # ---------------------------------------------------------------- across processes

    def to_json(self) -> dict[str, Any]:
        return {"hists": {m: base64.b64encode(h.encode()).decode() if h.get_total_count() else None
                          for m, h in self.hists.items()},
                "sent": self.sent, "ok": self.ok, "good": self.good, "errors": self.errors, "late": self.late,
                "max_late_us": self.max_late_us, "tokens": self.tokens}

    def merge(self, data: dict[str, Any]) -> None:
        for m, enc in data["hists"].items():
            if enc:
                self.hists[m].decode_and_add(base64.b64decode(enc))
        for k in ("sent", "ok", "good", "late", "tokens"):
            setattr(self, k, getattr(self, k) + data[k])
        self.max_late_us = max(self.max_late_us, data["max_late_us"])
        for kind, n in data["errors"].items():
            self.errors[kind] = self.errors.get(kind, 0) + n

    # ---------------------------------------------------------------- summary

    def percentile_ms(self, metric: str, q: float) -> float | None:
        h = self.hists[metric]
        return h.get_value_at_percentile(q) / 1e3 if h.get_total_count() else None

    def summary(self, requested_rps: float, elapsed_s: float) -> dict[str, Any]:
        failed = sum(self.errors.values())
        done = self.ok + failed
        out: dict[str, Any] = {
            "requested_rps": requested_rps, "achieved_rps": round(self.sent / elapsed_s, 3) if elapsed_s else 0.0,
            "sent": self.sent, "ok": self.ok, "errors": dict(self.errors), "error_rate": failed / done if done else 0.0,
            "goodput_rps": round(self.good / elapsed_s, 3) if elapsed_s else 0.0, "late_sends": self.late,
            "late_share": self.late / self.sent if self.sent else 0.0, "max_late_ms": self.max_late_us / 1e3,
            "output_tokens": self.tokens,
        }
        for m in METRICS:
            for name, q in (("p50", 50), ("p90", 90), ("p99", 99), ("p999", 99.9)):
                v = self.percentile_ms(m, q)
                if v is not None:
                    out[f"{name}_ms" if m == "e2e" else f"{m}_{name}_ms"] = round(v, 3)
        return out
