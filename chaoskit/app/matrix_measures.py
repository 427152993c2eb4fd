"""What one matrix cell measured, from its run's journal and the tap's log of every upstream attempt: the clients'
errors and p99 while the fault was in effect, how the gateway spread attempts (amplification, time to eject
and to readmit replica 0), whether goodput came back after the revert. The clients' load is continuous at a
constant rate: the clients' errors come from the during samples (each a window of what ended in it), the spread
of attempts from the tap over the fault's own span, divided by what the clients sent in it (rate x span: the
samples' sent_on_time_ratio, kept in the measures, says whether they kept the schedule)."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from chaoskit.engine.journal import read_journal
from chaoskit.model.events import FaultApplied, FaultReverted, Recovered, RunEnded, Sample

EJECTED_SHARE = 0.05  # replica 0 is ejected once its share of new attempts stays at most this
BIN_S = 0.5  # the share is counted in bins this long
LOAD_PATH = "/v1/completions"  # the clients' load (the answers probe sends chat completions, not counted here)
STREAM_ERRORS = ("stream_truncated", "stream_stalled", "stream_malformed", "stream_error")
UNSTEADY = "unsteady"  # the steady state did not hold before the fault: nothing was injected, nothing measured
NOT_STEADY_BEFORE = "steady state did not hold before the method"  # the run's deviation that says so


@dataclass
class CellMeasures:
    verdict: str
    exit_code: int
    client_requests: int = 0  # requests that ended (answered, failed or timed out) in the during windows
    sent_on_time_ratio: float | None = None  # the lowest of the during samples: 1.0 = the schedule was kept
    client_errors: int = 0
    error_rate: float | None = None
    all_p99_ms: float | None = None  # the worst during sample's p99 of all requests (failed ones at their timeout)
    errors_by_kind: dict[str, int] = field(default_factory=dict)
    stream_outcomes: dict[str, int] = field(default_factory=dict)  # the clients' load: streams cut, stalled ...
    answers: int = 0  # the answers probe's requests while the fault was in effect
    answer_grades: dict[str, int] = field(default_factory=dict)  # of those, each kind of wrong answer
    fault_s: float | None = None  # from the apply to the revert
    upstream_attempts: int | None = None  # completions the tap passed to a replica in that span
    amplification: float | None = None  # upstream attempts per client request sent in that span (rate x span)
    to_replica0: int | None = None  # of those, to the faulty replica
    time_to_eject_s: float | None = None  # None: never ejected while the fault lasted
    first_attempt_after_s: float | None = None  # from the revert to the tap's first attempt after it
    time_to_readmit_s: float | None = None  # from that attempt; None: replica 0 answered none before the run ended
    # (a matrix's readmit window keeps the run going that long after the revert)
    recovered_s: float | None = None
    metastable: bool = False  # goodput did not come back within the recovery window
    deviations: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """The tap's log: a JSON object a line, a torn line skipped."""
    if not path.exists():
        return []
    out = []
    for line in path.read_text(errors="replace").splitlines():
        try:
            out.append(json.loads(line))
        except ValueError:
            continue  # a torn last line
    return out


def measure(journal: Path, tap_log: Path | None, replica0: str, rate: float) -> CellMeasures:
    events = read_journal(journal) if journal.exists() else []
    end = next((e for e in reversed(events) if isinstance(e, RunEnded)), None)
    m = (CellMeasures(verdict=str(end.verdict), exit_code=end.exit_code, deviations=list(end.deviations)) if end
         else CellMeasures(verdict="incomplete", exit_code=3))
    recovered = next((e for e in events if isinstance(e, Recovered)), None)
    m.recovered_s = recovered.seconds if recovered else None
    applied = next((e for e in events if isinstance(e, FaultApplied)), None)
    reverted = next((e for e in events if isinstance(e, FaultReverted)), None)
    m.metastable = applied is not None and recovered is None and end is not None
    if applied is None and m.verdict == "deviated" and any(d.startswith(NOT_STEADY_BEFORE) for d in m.deviations):
        m.verdict = UNSTEADY
    during = [e for e in events if isinstance(e, Sample) and e.phase == "during"]
    _clients(m, [e.values for e in during if e.probe == "clients"])
    _answers(m, [e.values for e in during if e.probe == "answers"])
    if tap_log is not None and applied is not None and applied.applied_at is not None and reverted is not None:
        attempts = [a for a in read_jsonl(tap_log) if a.get("path") == LOAD_PATH]
        _spread(m, attempts, replica0, applied.applied_at, reverted.t, rate)
    return m


def _clients(m: CellMeasures, values: list[dict[str, Any]]) -> None:
    ratios = [v["sent_on_time_ratio"] for v in values if isinstance(v.get("sent_on_time_ratio"), (int, float))]
    m.sent_on_time_ratio = min(ratios) if ratios else None
    m.client_requests = sum(int(v.get("requests", 0)) for v in values)
    m.client_errors = sum(int(v.get("requests", 0)) - int(v.get("ok", 0)) for v in values)
    m.error_rate = round(m.client_errors / m.client_requests, 4) if m.client_requests else None
    p99 = [v["all_p99_ms"] for v in values if isinstance(v.get("all_p99_ms"), (int, float))]
    m.all_p99_ms = max(p99) if p99 else None
    kinds: dict[str, int] = {}
    for v in values:
        for k, n in (v.get("errors") or {}).items():
            kinds[k] = kinds.get(k, 0) + int(n)
    m.errors_by_kind = kinds
    m.stream_outcomes = {k: kinds.get(k, 0) for k in STREAM_ERRORS}


def _answers(m: CellMeasures, values: list[dict[str, Any]]) -> None:
    grades: dict[str, int] = {}
    for v in values:
        m.answers += int(v.get("requests", 0))
        for key, n in v.items():
            if key.startswith("failures.") and n:
                grades[key.removeprefix("failures.")] = grades.get(key.removeprefix("failures."), 0) + int(n)
    m.answer_grades = grades


def _spread(m: CellMeasures, attempts: list[dict[str, Any]], replica0: str, start: float, end: float,
            rate: float) -> None:
    within = [a for a in attempts if start <= a["t"] <= end]
    m.fault_s = round(end - start, 3)
    m.upstream_attempts = len(within)
    m.to_replica0 = sum(a["replica"] == replica0 for a in within)
    m.amplification = round(len(within) / (rate * (end - start)), 3) if end > start else None
    m.time_to_eject_s = time_to_eject(within, replica0, start, end)
    # the clients' load starts again after the revert (every request of the fault's span is judged in it, so the
    # span's load stops there and a new one starts: about a second here, more while requests in flight time out),
    # so readmission is counted from the first attempt after the revert (a gateway may also forward requests it
    # queued): the first attempt after that replica 0 answered (one sent on a connection the revert cut, or refused
    # by a replica that is gone, did not reach it: no status)
    resumed = min((a["t"] for a in attempts if a["t"] >= end), default=None)
    if resumed is None:
        return
    m.first_attempt_after_s = round(resumed - end, 3)
    back = [a["t"] for a in attempts if a["t"] >= end and a["replica"] == replica0 and a.get("status")]
    m.time_to_readmit_s = round(min(back) - resumed, 3) if back else None


def time_to_eject(attempts: list[dict[str, Any]], replica0: str, start: float, stop: float) -> float | None:
    """From `start` until replica 0's share of attempts stays <= EJECTED_SHARE in every BIN_S bin that has
    attempts, to `stop`, with at least two such bins after it; None if it never does."""
    n = max(1, int((stop - start) / BIN_S + 0.999))
    bins: list[tuple[int, int]] = [(0, 0)] * n  # (attempts, to replica 0) per bin
    for a in attempts:
        i = min(n - 1, int((a["t"] - start) / BIN_S))
        total, bad = bins[i]
        bins[i] = (total + 1, bad + (a["replica"] == replica0))
    for i in range(n):
        rest = [(t, b) for t, b in bins[i:] if t]
        if len(rest) >= 2 and all(b / t <= EJECTED_SHARE for t, b in rest):
            return round(i * BIN_S, 3)
    return None
