"""One judgement (issue 43, item 4): JUnit, the Markdown summary, the HTML phase table, the live view and the
metrics render the judgement the engine recorded on each sample, and fail a phase exactly when the engine's
judgement of it failed: an after phase that recovered within steadyState.after.within is no failure, samples of
an unjudged phase (grace, between) are none, and a run that deviated for a reason no phase shows still fails."""

from __future__ import annotations

import io
from typing import Any

from prometheus_client import generate_latest
from rich.console import Console

from chaoskit.model.events import Event, from_json
from chaoskit.observe.metrics import RunMetrics
from chaoskit.report import html, markdown
from chaoskit.report.outputs import junit_suite
from chaoskit.report.view import run_view
from chaoskit.ui import LiveView

T0 = 1000.0


def _sample(dt: float, phase: str, value: float, bound: float = 300.0) -> dict[str, Any]:
    ok = value < bound
    why = f"{value:g} < {bound:g}" + ("" if ok else " is false")
    return {"t": T0 + dt, "event": "sample", "probe": "api", "phase": phase, "verdict": "ok" if ok else "fail",
            "values": {"latency_ms": value}, "details": [f"latency_ms: {why}"], "duration_ms": 5.0,
            "judgements": [{"key": "latency_ms", "rule": f"< {bound:g}", "value": value, "threshold": bound,
                            "outcome": "ok" if ok else "fail", "why": why}]}


def _run(*middle: dict[str, Any], verdict: str = "held", deviations: tuple[str, ...] = (),
         exit_code: int = 0) -> list[Event]:
    lines = [{"t": T0, "event": "experiment", "file": "e.yaml", "document": {"metadata": {"name": "e"}},
              "expect": {"api": {"latency_ms": {"kind": "cmp", "op": "<", "value": 300.0}}}},
             {"t": T0, "event": "run", "run_id": "r1", "experiment": "e"},
             {"t": T0 + 0.1, "event": "state", "state": "hypothesis_before"},
             _sample(0.2, "before", 20),
             {"t": T0 + 1, "event": "state", "state": "method"},
             *middle,
             {"t": T0 + 20, "event": "end", "verdict": verdict, "exit_code": exit_code,
              "deviations": list(deviations)}]
    return [from_json(line) for line in lines]


RECOVERED = (_sample(2, "during", 30), _sample(3, "grace", 900), _sample(4, "between", 800),
             {"t": T0 + 6, "event": "state", "state": "hypothesis_after"},
             _sample(6.5, "after", 700), _sample(7, "after", 650), _sample(7.5, "after", 40),
             {"t": T0 + 7.6, "event": "recovered", "seconds": 1.1})


def _failed(events: list[Event]) -> dict[str, str]:
    suite = junit_suite(run_view(events))
    return {tc.get("name"): tc.find("failure").get("message") for tc in suite.iter("testcase")
            if tc.find("failure") is not None}


def test_junit_of_a_run_that_recovered_after_the_fault_has_no_failure():
    events = _run(*RECOVERED)
    assert _failed(events) == {}
    suite = junit_suite(run_view(events))
    after = next(tc for tc in suite.iter("testcase") if tc.get("name") == "after: api")
    assert "2/3 samples did not hold before the steady state held again" in after.find("system-out").text
    assert suite.get("failures") == "0"


def test_junit_fails_the_after_phase_that_did_not_recover_with_what_kept_it():
    events = _run(*RECOVERED[:4], _sample(6.5, "after", 700), _sample(7, "after", 650), verdict="deviated",
                  deviations=("steady state did not hold again within 1s after rollback",), exit_code=1)
    assert _failed(events) == {"after: api": "the steady state did not hold again: latency_ms: 650 < 300 is false"}


def test_junit_fails_a_during_phase_the_engine_failed_and_a_deviation_no_phase_shows():
    during = _run(_sample(2, "during", 500), verdict="deviated", deviations=("api deviated",), exit_code=1)
    assert list(_failed(during)) == ["during: api"]
    dead = _run(*RECOVERED, verdict="deviated", exit_code=1,
                deviations=("freeze: PID 7 tritonserver exited after the fault was reverted",))
    assert _failed(dead) == {"deviations": "freeze: PID 7 tritonserver exited after the fault was reverted"}


def test_summary_and_report_tables_say_what_junit_says():
    view = run_view(_run(*RECOVERED))
    text = markdown.render(view)
    assert "✅ 2/3 failed, then held again" in text and "❌" not in text
    assert "⚪ 1/1 failed" in text  # grace and between: drawn, never judged
    page = html.render(view)
    assert "<td class='ok'>2/3 failed, then held again</td>" in page and "class='bad'" not in page


def test_the_live_view_shows_the_threshold_the_engine_judged_and_the_phase_as_it_judged_it():
    live = LiveView(Console(file=io.StringIO()), "e", {"api": ["latency_ms"]})
    for ev in _run(*RECOVERED):
        live(ev)
    console = Console(file=io.StringIO(), width=200, record=True)
    console.print(live._render())
    text = console.export_text()
    assert "✓ < 300" in text  # the latest judgement of the key and what it was compared with
    styles = {str(span.style) for span in live._probes().columns[4]._cells[0].spans}
    assert "red" not in styles  # the after phase recovered: 2 failed samples are no failed phase


def test_metrics_carry_each_keys_judgement_and_threshold():
    m = RunMetrics("e", "r1")
    for ev in _run(_sample(2, "during", 500)):
        m(ev)
    text = generate_latest(m.registry).decode()
    assert 'chaoskit_probe_judgement_ok{experiment="e",key="latency_ms",phase="during",probe="api",run_id="r1"} 0.0' \
        in text
    assert 'chaoskit_probe_threshold{experiment="e",key="latency_ms",probe="api",run_id="r1"} 300.0' in text
