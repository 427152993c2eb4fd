"""HDR histograms of one load run (microseconds), mergeable across worker processes, and the summary.
The hot path adds to a histogram's counts directly (~0.5 us a value, no pauses); totals and min/max are
derived from the counts when the histograms are read, as hdrh itself does after a merge. With group_by, each
response is also recorded in the recorder of its group (a response header's value, e.g. the replica).
Two views of latency: the successes-only histograms (e2e, ttft ... -> p99_ms, ttft_p99_ms) and the all-requests
ones (all_e2e, all_ttft -> all_p99_ms, all_ttft_p99_ms), where a failed or timed-out request counts at its
timeout, or at the time it failed if later (failed_at): half the requests failing shows as a p99 at the timeout,
not as a fast service."""

from __future__ import annotations

import base64
import ctypes
import sys
from dataclasses import dataclass, field
from typing import Any

from hdrh.histogram import HdrHistogram

METRICS = ("e2e", "service", "ttft", "itl", "tpot", "all_e2e", "all_ttft")  # e2e/ttft from the intended send;
# service from the actual; all_*: every request that ended, a failure at failed_at() (its time, at least the timeout)
# How a request can fail (Recorder.errors keys): no answer in time, no connection, an HTTP error status (429
# without / with Retry-After, 503 with Retry-After, any other >= 400), a stream cut before its end (no final
# chunk, no data: [DONE]), a stream with no token for longer than stall_timeout, an event that is no SSE or no
# JSON object, an error object in a 200 answer, anything else (reset, bad framing).
ERROR_KINDS = ("timeout", "connect", "http_status", "rate_limited", "rate_limited_retry_after",
               "unavailable_retry_after", "stream_truncated", "stream_stalled", "stream_malformed", "stream_error",
               "other")
PYTHON_ONLY_KINDS = ("rate_limited", "rate_limited_retry_after", "unavailable_retry_after", "stream_stalled",
                     "stream_malformed")  # the native sender counts these as http_status/other
LOWEST, HIGHEST, DIGITS = 1, 3_600_000_000, 3
LATE_US = 1000  # a send more than 1 ms after its intended time is late
LATE_S = LATE_US / 1e6
NO_GROUP = "none"  # a request without the header in its answer: no response head came (connect error, timeout)
OTHER_GROUP = "other"  # values after the first MAX_GROUPS distinct ones (a per-request header would explode)
MAX_GROUPS = 32
GROUP_VALUE_MAX = 64


def _hist() -> HdrHistogram:
    return HdrHistogram(LOWEST, HIGHEST, DIGITS)


_L = _hist()  # every histogram here has this layout
_MASK, _UNIT, _SHCM, _HALF = _L.sub_bucket_mask, _L.unit_magnitude, _L.sub_bucket_half_count_magnitude, \
    _L.sub_bucket_half_count


def layout() -> dict[str, int]:
    """The bucket layout every histogram here shares (for the native sender's copy of `add`)."""
    return {"counts_len": _L.counts_len, "sub_bucket_mask": _MASK, "sub_bucket_half_count": _HALF,
            "unit_magnitude": _UNIT, "sub_bucket_half_count_magnitude": _SHCM, "lowest": LOWEST, "highest": HIGHEST}


def add(counts: Any, seconds: float) -> None:
    """The bucket HdrHistogram.record_value(round(seconds * 1e6)) counts in, incremented."""
    us = round(seconds * 1e6)
    if us < LOWEST:
        us = LOWEST
    elif us > HIGHEST:
        us = HIGHEST
    b = (us | _MASK).bit_length() - _UNIT - _SHCM - 1
    counts[((b + 1) << _SHCM) + (us >> (b + _UNIT)) - _HALF] += 1


def _sync(h: HdrHistogram) -> HdrHistogram:
    import numpy as np  # here: ~0.1 s of every chaoskit process's start otherwise, most of which load nothing

    counts = np.ctypeslib.as_array(h.counts)
    used = np.flatnonzero(counts)
    if used.size:
        h.set_internal_tacking_values(int(used[0]), int(used[-1]), int(counts.sum()))
    return h


def load_readers() -> None:
    """Import, and run once, what reading a recorder needs (numpy, hdrh's encoder). A sender calls it before its
    clock starts: else its first window report pays for it while it sends (sends up to 24-63 ms late there)."""
    rec = Recorder()
    rec.success(0.001, 0.001, None, [], 0, True)
    rec.to_json()


@dataclass
class Recorder:
    _hists: dict[str, HdrHistogram] = field(default_factory=lambda: {m: _hist() for m in METRICS})
    sent: int = 0
    ok: int = 0
    good: int = 0  # met every SLO
    errors: dict[str, int] = field(default_factory=dict)
    late: int = 0
    max_late_us: int = 0
    tokens: int = 0
    groups: dict[str, Recorder] = field(default_factory=dict)  # group_by: one recorder per header value

    def group(self, value: str | None) -> Recorder:
        """The recorder of one group (created on first use): `none` without a value; the values after the first
        MAX_GROUPS distinct ones share `other`."""
        name = group_name(value)
        rec = self.groups.get(name)
        if rec is None:
            if name not in (NO_GROUP, OTHER_GROUP) and \
                    len(self.groups.keys() - {NO_GROUP, OTHER_GROUP}) >= MAX_GROUPS:
                name = OTHER_GROUP
                rec = self.groups.get(name)
            if rec is None:
                rec = self.groups[name] = Recorder()
        return rec

    def sent_at(self, lateness_s: float) -> None:
        self.sent += 1
        if lateness_s > LATE_S:
            self.late += 1
        us = lateness_s * 1e6
        if us > self.max_late_us:
            self.max_late_us = round(us)

    def success(self, e2e: float, service: float, ttft: float | None, itls: list[float], tokens: int,
                good: bool) -> None:
        self.ok += 1
        self.good += good
        self.tokens += tokens
        h = self._hists
        add(h["e2e"].counts, e2e)
        add(h["all_e2e"].counts, e2e)
        add(h["service"].counts, service)
        if ttft is not None:
            add(h["ttft"].counts, ttft)
            add(h["all_ttft"].counts, ttft)
            if tokens > 1:
                add(h["tpot"].counts, (e2e - ttft) / (tokens - 1))
        if itls:
            counts = h["itl"].counts
            for gap in itls:
                add(counts, gap)

    @property
    def hists(self) -> dict[str, HdrHistogram]:
        return {m: _sync(h) for m, h in self._hists.items()}

    def failure(self, kind: str, waited: float | None = None, streamed: bool = False) -> None:
        """One failed request of `kind`; `waited`: what it counts as in the all-requests histograms (failed_at:
        its timeout, or the time it failed if later), also as its TTFT when the run streams (no answer came)."""
        self.errors[kind] = self.errors.get(kind, 0) + 1
        if waited is not None:
            add(self._hists["all_e2e"].counts, waited)
            if streamed:
                add(self._hists["all_ttft"].counts, waited)

    def counts(self, metric: str) -> ctypes.Array:
        """The bucket counts of one metric's histogram (the native sender adds to them in place)."""
        return self._hists[metric].counts

    def reset(self) -> None:
        """Start a new window (continuous probing reports per window); the histograms are zeroed in place."""
        for h in self._hists.values():
            ctypes.memset(h.counts, 0, ctypes.sizeof(h.counts))
            h.total_count, h.min_value, h.max_value = 0, sys.maxsize, 0
        self.sent = self.ok = self.good = self.late = self.max_late_us = self.tokens = 0
        self.errors = {}
        self.groups = {}

    # ---------------------------------------------------------------- across processes

    def to_json(self) -> dict[str, Any]:
        out = {"hists": {m: base64.b64encode(h.encode()).decode() if h.get_total_count() else None
                         for m, h in self.hists.items()},
               "sent": self.sent, "ok": self.ok, "good": self.good, "errors": self.errors, "late": self.late,
               "max_late_us": self.max_late_us, "tokens": self.tokens}
        if self.groups:
            out["groups"] = {name: rec.to_json() for name, rec in self.groups.items()}
        return out

    def merge(self, data: dict[str, Any]) -> None:
        for m, enc in data["hists"].items():
            if enc:
                _sync(self._hists[m]).decode_and_add(base64.b64decode(enc))
        for k in ("sent", "ok", "good", "late", "tokens"):
            setattr(self, k, getattr(self, k) + data[k])
        self.max_late_us = max(self.max_late_us, data["max_late_us"])
        for kind, n in data["errors"].items():
            self.errors[kind] = self.errors.get(kind, 0) + n
        for name, part in data.get("groups", {}).items():
            self.group(name).merge(part)

    # ---------------------------------------------------------------- summary

    def percentile_ms(self, metric: str, q: float) -> float | None:
        h = _sync(self._hists[metric])
        return h.get_value_at_percentile(q) / 1e3 if h.get_total_count() else None

    def summary(self, requested_rps: float, elapsed_s: float, scheduled: int) -> dict[str, Any]:
        """The run's numbers; with groups also each group's outcomes as `KEY[group]` (p99_ms[triton-0]).
        `scheduled` is how many sends the schedule held in the span (a Poisson schedule holds a random count):
        the ratios divide by it, so a steady server scores ~1 whatever the arrival process, and one that
        answers nothing scores 0 on completed_ratio however punctually the sends left."""
        on_time = self.sent - self.late
        out: dict[str, Any] = {
            "requested_rps": requested_rps, "achieved_rps": round(self.sent / elapsed_s, 3) if elapsed_s else 0.0,
            "scheduled": scheduled, "sent": self.sent, "sent_on_time": on_time,
            "sent_on_time_ratio": _share(on_time, scheduled), "completed_ratio": _share(self.ok, scheduled),
            "completed_rps": round(self.ok / elapsed_s, 3) if elapsed_s else 0.0,
            "errors": dict(self.errors), "late_sends": self.late,
            "late_share": self.late / self.sent if self.sent else 0.0, "max_late_ms": self.max_late_us / 1e3,
            **self.outcomes(elapsed_s),
        }
        for group, rec in sorted(self.groups.items()):
            out.update({f"{k}[{group}]": v for k, v in rec.outcomes(elapsed_s).items()})
        return out

    def outcomes(self, elapsed_s: float) -> dict[str, Any]:
        """What is known of the answers (so also per group): requests completed, errors, goodput, percentiles."""
        failed = sum(self.errors.values())
        done = self.ok + failed
        out: dict[str, Any] = {
            "requests": done, "ok": self.ok, "error_rate": failed / done if done else 0.0,
            "goodput_rps": round(self.good / elapsed_s, 3) if elapsed_s else 0.0, "output_tokens": self.tokens,
        }
        for m in METRICS:
            for name, q in (("p50", 50), ("p90", 90), ("p99", 99), ("p999", 99.9)):
                v = self.percentile_ms(m, q)
                if v is not None:
                    out[f"{key_prefix(m)}{name}_ms"] = round(v, 3)
        return out


def key_prefix(metric: str) -> str:
    """What a metric's percentile keys start with: e2e '' (p99_ms), all_e2e 'all_' (all_p99_ms), ttft 'ttft_',
    all_ttft 'all_ttft_'."""
    if metric in ("e2e", "all_e2e"):
        return metric.removesuffix("e2e")
    return f"{metric}_"


def failed_at(timeout: float, since_intended: float) -> float:
    """What a failed request counts as in the all-requests histograms: its timeout, or its time if later."""
    return max(timeout, since_intended)


def _share(n: int, scheduled: int) -> float:
    """n of the scheduled sends, at most 1 (a window also counts answers to sends due in the one before); 1.0
    when nothing was due."""
    return min(1.0, n / scheduled) if scheduled else 1.0


def group_name(value: str | None) -> str:
    """A header value as a group name usable in a key: trimmed, brackets replaced, at most GROUP_VALUE_MAX."""
    if value is None or not value.strip():
        return NO_GROUP
    return value.strip().replace("[", "(").replace("]", ")")[:GROUP_VALUE_MAX]
