"""The live view is a rendering of the run's RunView as events arrive: the phase, each probe's failed/samples per
phase, a tripped safeguard, the faults still in effect, the notes (recovery included)."""

from __future__ import annotations

import io

from rich.console import Console

from chaoskit.model.events import (
    FaultApplied,
    FaultReverted,
    Recovered,
    RuleRecord,
    SafeguardRecord,
    SafeguardTripped,
    Sample,
    StateChanged,
)
from chaoskit.ui import HISTORY, LiveView


def _text(view: LiveView) -> str:
    console = Console(file=io.StringIO(), width=200, record=True)
    console.print(view._render())
    return console.export_text()


def _sample(t: float, phase: str, verdict: str, v: float) -> Sample:
    return Sample(t=t, probe="api", phase=phase, verdict=verdict, values={"latency_ms": v},
                  details=[f"latency_ms: {v:g} < 300" + ("" if verdict == "ok" else " is false")])


def test_the_live_view_renders_the_run_view():
    guard = SafeguardRecord(probe="api", rules=[RuleRecord(metric="latency_ms", op=">", value=900.0,
                                                           text="latency_ms > 900")])
    view = LiveView(Console(file=io.StringIO()), "exp", {"api": ["latency_ms"]}, [guard])
    view(StateChanged(t=1.0, state="method", previous="hypothesis_before"))
    view(_sample(1.0, "before", "ok", 20))
    view(FaultApplied(t=2.0, id=1, step="freeze", type="process.signal", applied_at=2.0))
    view(_sample(2.5, "during", "fail", 950))
    view(_sample(3.0, "during", "ok", 30))
    text = _text(view)
    assert "phase: method" in text and "before 0/1" in text and "during 1/2" in text
    assert "freeze" in text and "until rollback" in text and "watching" in text
    view(SafeguardTripped(t=3.5, probe="api", reason="safeguard api: latency_ms: 950 > 900"))
    view(FaultReverted(t=4.0, id=1, type="process.signal"))
    view(Recovered(t=5.0, seconds=0.5))
    text = _text(view)
    assert "TRIPPED: safeguard api: latency_ms: 950 > 900" in text and "freeze" not in text
    assert view.notes() == ["safeguard: probe=api, reason=safeguard api: latency_ms: 950 > 900",
                            "recovered: seconds=0.5"]


def test_the_live_view_keeps_only_the_latest_samples_but_counts_all():
    view = LiveView(Console(file=io.StringIO()), "exp")
    for i in range(HISTORY + 10):
        view(_sample(float(i), "during", "fail" if i % 2 else "ok", float(i)))
    assert len(view.history("api")) == HISTORY and view.history("api")[-1].t == HISTORY + 9
    assert view.view.counts["api"]["during"] == (HISTORY + 10, (HISTORY + 10) // 2)


def test_the_live_view_follows_the_all_requests_p99_beside_the_judged_key():
    view = LiveView(Console(file=io.StringIO()), "exp", {"sla": ["error_rate"]})
    for t, (p99, all_p99, rate) in enumerate(((12.0, 15.0, 0.0), (12.071, 800.0, 0.48))):
        view(Sample(t=float(t), probe="sla", phase="during", verdict="ok", duration_ms=1.0,
                    values={"p99_ms": p99, "all_p99_ms": all_p99, "error_rate": rate}))
    text = _text(view)
    assert "error_rate " in text and "all_p99_ms " in text and " 800" in text
    alone = LiveView(Console(file=io.StringIO()), "exp")  # nothing judged: the all-requests p99 is the one
    alone(Sample(t=1.0, probe="sla", phase="during", verdict="ok", values={"sent": 5, "all_p99_ms": 7.0}))
    assert alone._key("sla") == "all_p99_ms" and _text(alone).count("all_p99_ms ") == 1
