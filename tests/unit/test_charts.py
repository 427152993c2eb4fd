"""Chart geometry and what the report's charts are made of: a sample at time t lands at x(t), a fault window
spans x(apply)..x(revert), tolerance lines sit at their value, failed judged samples are marked deviating."""

from __future__ import annotations

import asyncio
from typing import Any, ClassVar
from xml.etree import ElementTree as ET

import pytest

from chaoskit.engine.steady_state import Baselines, take_sample
from chaoskit.model.events import from_json
from chaoskit.model.tolerance import Tolerance, parse_tolerance
from chaoskit.probes.base import Probe
from chaoskit.probes.slo import SloProbeSpec
from chaoskit.report.charts import (
    Layout,
    Line,
    Mark,
    Panel,
    Scale,
    Series,
    Window,
    nice_step,
    on_scale,
    sparkline,
    ticks,
    timeline_svg,
    value_domain,
)
from chaoskit.report.html import render
from chaoskit.report.outputs import junit_suite
from chaoskit.report.panels import family, fixed_bounds, mark_state, panels_for
from chaoskit.report.view import last_run, run_view

SVG = "{http://www.w3.org/2000/svg}"
T0, T1 = 1000.0, 1030.0


def _svg(panels, verdicts=(), faults=(), layout=None):
    text = timeline_svg("p", T0, T1, list(panels), list(verdicts), list(faults), [], [], layout)
    return ET.fromstring(text)  # well-formed XML, or this raises


def _by_class(root, css):
    return [el for el in root.iter() if css in (el.get("class") or "").split()]


def test_scale_maps_ends_and_middle_and_a_flat_domain():
    s = Scale(10, 20, 100, 300)
    assert (s(10), s(15), s(20)) == (100, 200, 300)
    up = Scale(0, 50, 200, 100)  # a y axis: larger values higher up (smaller y)
    assert up(0) == 200 and up(50) == 100
    assert Scale(5, 5, 0, 10)(5) == 5  # no span: the middle


@pytest.mark.parametrize("t", [T0, T0 + 0.37, T0 + 12.5, T1])
def test_a_sample_at_time_t_lands_at_x_of_t(t):
    lay = Layout(width=800, left=50, right=100)
    marks = [Mark(t, 3.0, "ok", True), Mark(T0 + 20, 4.0, "ok", True)]
    root = _svg([Panel("v", [Series("p", "v", marks)])], layout=lay)
    x = lay.x(T0, T1)
    circle = next(c for c in root.iter(f"{SVG}circle") if float(c.get("data-t")) == t)
    assert float(circle.get("cx")) == pytest.approx(x(t), abs=0.01)
    assert x(T0) == 50 and x(T1) == 700
    # the series' path goes through the same point
    path = _by_class(root, "series")[0]
    assert path.get("d").startswith(f"M{x(t):.2f},") or f"{x(t):.2f}," in path.get("d")


def test_verdict_lane_marks_and_error_crosses_sit_at_x_of_t_too():
    lay = Layout()
    x = lay.x(T0, T1)
    err = Mark(T0 + 7.25, None, "error", True, "timed out")
    root = _svg([Panel("latency_ms", [Series("p", "latency_ms", [err])])], verdicts=[err])
    cross = next(el for el in _by_class(root, "error") if el.tag == f"{SVG}path")
    assert float(cross.get("data-x")) == pytest.approx(x(T0 + 7.25), abs=0.01)
    dot = next(el for el in _by_class(root, "verdict"))
    assert float(dot.get("cx")) == pytest.approx(x(T0 + 7.25), abs=0.01)
    assert "deviating" in dot.get("class")


def test_fault_window_spans_apply_to_revert_and_is_labelled():
    lay = Layout()
    x = lay.x(T0, T1)
    w = Window(T0 + 5, T0 + 19, "#1 freeze", "fault", "applied +5s", "1")
    root = _svg([Panel("v", [Series("p", "v", [Mark(T0 + 6, 1.0, "ok", True)])])], faults=[w])
    rect = _by_class(root, "fault-window")[0]
    assert float(rect.get("x")) == pytest.approx(x(T0 + 5), abs=0.01)
    assert float(rect.get("width")) == pytest.approx(x(T0 + 19) - x(T0 + 5), abs=0.01)
    assert _by_class(root, "fault-label")[0].text == "#1 freeze"


def test_overlapping_fault_labels_get_their_own_rows():
    faults = [Window(T0 + 1, T0 + 9, "#1 a-long-label-here", "fault"), Window(T0 + 2, T0 + 5, "#2 b", "fault")]
    root = _svg([], faults=faults)
    ys = [float(el.get("y")) for el in _by_class(root, "fault-label")]
    assert ys[0] != ys[1]


def test_tolerance_line_sits_at_its_value_and_failed_samples_are_deviating():
    lay = Layout(panel_h=100)
    marks = [Mark(T0 + 1, 100.0, "ok", True), Mark(T0 + 2, 400.0, "fail", True),
             Mark(T0 + 3, 380.0, "fail", False)]  # a grace sample: drawn, not judged
    root = _svg([Panel("p99_ms", [Series("p", "p99_ms", marks)], [Line(300.0, "< 300")])], layout=lay)
    line = _by_class(root, "tolerance")[0].find(f"{SVG}line")
    circles = {float(c.get("data-t")): c for c in root.iter(f"{SVG}circle")}
    y_of = {t: float(c.get("cy")) for t, c in circles.items()}
    lo, hi = value_domain([100.0, 400.0, 380.0, 300.0])
    y = Scale(lo, hi, float(line.get("y1")) + (300 - lo) / (hi - lo) * lay.panel_h, 0.0)
    assert lo == 0 and hi >= 400
    # a value above the line is drawn above it (smaller y), one below it below
    assert y_of[T0 + 2] < float(line.get("y1")) < y_of[T0 + 1]
    assert y(0) > y(400)
    assert "deviating" in circles[T0 + 2].get("class")
    assert "deviating" not in circles[T0 + 3].get("class") and "unjudged" in circles[T0 + 3].get("class")
    assert "deviating" not in circles[T0 + 1].get("class")


def test_a_bound_far_above_the_data_is_noted_at_the_edge_not_scaled_into_it():
    marks = [Mark(T0 + 1, 12.0, "ok", True), Mark(T0 + 2, 20.0, "ok", True)]
    root = _svg([Panel("latency_ms", [Series("p", "latency_ms", marks)], [Line(500.0, "< 500")])])
    assert not on_scale(500, [12, 20]) and on_scale(0.01, [0, 0]) and on_scale(30, [12, 20])
    off = _by_class(root, "off-scale")
    assert off and "< 500" in "".join(off[0].itertext())


def test_a_safeguard_label_is_never_cut_at_the_charts_edge():
    """`abort if latency_ms > 8000` read `... > 800` in the report: the label ran past the chart's right edge.
    The chart is as wide as its longest label needs; the plot keeps its width."""
    marks = [Mark(T0 + 1, 120.0, "ok", True), Mark(T0 + 2, 9000.0, "ok", False)]
    lines = [Line(8000.0, "abort if latency_ms > 8000", "safeguard"),
             Line(1e9, "abort if all_requests_ttft_p999_ms[tenant-with-a-long-name] > 123456789", "safeguard")]
    root = _svg([Panel("latency_ms", [Series("p", "latency_ms", marks)], lines)])
    width = float(root.get("width"))
    assert root.get("viewBox") == f"0 0 {root.get('width')} {root.get('height')}"
    for g in _by_class(root, "safeguard-line"):
        text = g.find(f"{SVG}text")
        label = "".join(text.itertext())
        assert label.endswith(("8000", "123456789"))
        assert float(text.get("x")) + 6.8 * len(label) <= width, label  # all of it inside the chart
    plot = _by_class(root, "panel")[0].find(f"{SVG}rect")
    assert float(plot.get("width")) == Layout().width - Layout().left - Layout().right


def test_ticks_and_steps_are_round():
    assert nice_step(10, 5) == 2 and nice_step(7, 4) == 2 and nice_step(0.9, 4) == 0.25
    assert ticks(0, 7, 4) == [0, 2, 4, 6]
    assert ticks(0, 1, 4) == [0, 0.25, 0.5, 0.75, 1.0]
    assert value_domain([3.0, 17.0]) == (0.0, 20.0)
    assert value_domain([-3.0, 3.0])[0] < 0


def test_sparkline():
    assert sparkline([0, 1, 2, 3, 4, 5, 6, 7]) == "▁▂▃▄▅▆▇█"
    assert sparkline([5, None, 5]) == "▁·▁"
    assert sparkline([None]) == "·" and len(sparkline(list(range(100)), 24)) == 24


def test_families_and_thresholds():
    assert family("p99_ms") == family("p50_ms") == "percentiles (ms)"
    assert family("ttft_p99_ms") == "ttft_percentiles (ms)"
    assert family("all_p99_ms") == "percentiles (ms, all requests)"
    assert family("all_ttft_p50_ms") == "ttft_percentiles (ms, all requests)"
    assert family("p99_ms[triton-0]") == family("p99_ms[triton-1]") == "p99_ms by group"
    assert family("error_rate") == "error_rate"
    assert fixed_bounds(parse_tolerance("< 950")) == [(950.0, "< 950")]
    base = Tolerance.from_json({"kind": "baseline", "op": "<", "expr": "3x baseline", "scale": 3.0, "offset": 0.0})
    assert fixed_bounds(base) == []  # a baseline rule's threshold is the engine's, on each judgement
    assert fixed_bounds(parse_tolerance("1..2")) == [(1.0, ">= 1"), (2.0, "<= 2")]
    assert fixed_bounds(parse_tolerance("~ ok")) == []


def test_marks_are_the_engines_judgements_not_the_tolerance_judged_again():
    def sample(verdict, judgements=None, **values):
        return from_json({"t": 1.0, "event": "sample", "probe": "p", "phase": "during", "verdict": verdict,
                          "values": values, "details": ["v: said to fail, but no word of it is read"],
                          **({"judgements": judgements} if judgements is not None else {})})

    def judged(outcome, value):
        return {"key": "v", "rule": "< 3x baseline", "value": value, "threshold": 361.5, "baseline": 120.5,
                "outcome": outcome}

    assert mark_state(sample("fail", [judged("fail", 400)], v=400), "v") == "fail"
    assert mark_state(sample("fail", [judged("ok", 300)], v=300), "v") == "ok"  # another key failed the sample
    # what the engine said stands, even where the rule read today would say otherwise
    assert mark_state(sample("ok", [judged("ok", 400)], v=400), "v") == "ok"
    assert mark_state(sample("fail", [judged("fail", 3)], v=3), "w") == "ok"  # a key it did not judge
    assert mark_state(sample("error"), "v") == "error"
    # a journal written before judgements were recorded: the sample's verdict for a key its words judged
    assert mark_state(sample("fail", v=400), "v") == "fail" and mark_state(sample("fail", v=400), "w") == "ok"


class _Scripted(Probe):
    type: ClassVar[str] = "scripted"
    summary: ClassVar[str] = "test"

    def __init__(self, spec: Any, answers: list[dict[str, Any]]):
        super().__init__(spec)
        self.answers = answers

    async def measure(self) -> dict[str, Any]:
        return self.answers.pop(0)


def test_a_report_of_a_baseline_run_marks_exactly_the_samples_the_engine_failed():
    """`< baseline`: the before sample is the baseline (ok for the engine; judged again against itself it read
    `40 < 40`, false, and the chart marked it failed). The report, its charts and JUnit show the engine's
    judgement and its threshold, resolved from the baseline."""
    spec = SloProbeSpec(type="slo", name="sla", load={"url": "http://127.0.0.1:9/", "rate": 10, "duration": 1},
                        expect={"p99_ms": "< baseline"})
    probe = _Scripted(spec, [{"p99_ms": v} for v in (40.0, 30.0, 55.0, 39.0, 41.0)])
    baselines = Baselines()
    phases = ["before", "during", "during", "during", "after"]
    samples = []
    for i, phase in enumerate(phases):
        s = asyncio.run(take_sample(probe, phase, baselines))
        samples.append(s.model_copy(update={"t": T0 + 1 + i}))
    engine = [s.judgement("p99_ms").outcome for s in samples]
    assert engine == ["ok", "ok", "fail", "ok", "fail"]
    tol = parse_tolerance("< baseline")
    events = [from_json({"t": T0, "event": "experiment", "file": "e.yaml", "document": {"metadata": {"name": "e"}},
                         "expect": {"sla": {"p99_ms": tol.to_json()}}}),
              from_json({"t": T0, "event": "run", "run_id": "r1", "experiment": "e"}), *samples,
              from_json({"t": T0 + 9, "event": "end", "verdict": "deviated", "exit_code": 1,
                         "deviations": ["sla deviated during the method"]})]
    view = run_view(events)
    main, _ = panels_for(view, "sla")
    p99 = next(series for panel in main for series in panel.series if series.key == "p99_ms")
    assert [m.state for m in p99.marks] == engine
    assert [ln.value for panel in main for ln in panel.lines if ln.kind == "tolerance"] == [40.0]
    root = ET.fromstring(render(view).split("<div class='chart'>", 1)[1].split("</div>", 1)[0])
    deviating = [float(el.get("data-t")) for el in _by_class(root, "deviating") if el.get("data-t")
                 and "verdict" not in (el.get("class") or "")]
    assert deviating == [T0 + 3, T0 + 5]
    suite = junit_suite(view)
    failed = [tc.get("name") for tc in suite.iter("testcase") if tc.find("failure") is not None]
    assert failed == ["during: sla", "after: sla"]


def _journal():
    t = T0
    exp = {"t": t, "event": "experiment", "file": "e.yaml", "vars": {}, "document": {"metadata": {"name": "e"}},
           "expect": {"sla": {"p99_ms": {"kind": "cmp", "op": "<", "value": 950.0},
                              "error_rate": {"kind": "cmp", "op": "<", "value": 0.01}}},
           "safeguards": [{"probe": "sla", "rules": [{"metric": "error_rate", "op": ">", "value": 0.5,
                                                        "text": "error_rate > 0.5"}]}]}

    def sample(dt, phase, verdict, **values):  # judged as the engine judges `< 950` and `< 0.01`
        judgements = [{"key": k, "rule": f"< {bound:g}", "value": values[k], "threshold": bound,
                       "outcome": "ok" if values[k] < bound else "fail"}
                      for k, bound in (("p99_ms", 950.0), ("error_rate", 0.01))]
        return {"t": t + dt, "event": "sample", "probe": "sla", "phase": phase, "verdict": verdict,
                "values": values, "details": [], "error": None, "duration_ms": 5.0, "judgements": judgements}

    return [exp, {"t": t, "event": "run", "run_id": "r1", "experiment": "e"},
            {"t": t + 0.1, "event": "state", "state": "hypothesis_before"},
            sample(0.2, "before", "ok", p50_ms=10.0, p99_ms=20.0, error_rate=0.0, sent=20),
            {"t": t + 1, "event": "state", "state": "method"},
            {"t": t + 1.5, "event": "fault_applied", "id": 1, "step": "slow", "type": "process.cpu_throttle",
             "applied_at": t + 1.5, "duration_s": 4.0, "apply_ms": 3.0},
            sample(2.0, "during", "fail", p50_ms=15.0, p99_ms=800.0, error_rate=0.2, sent=20),
            sample(4.0, "grace", "fail", p50_ms=15.0, p99_ms=990.0, error_rate=0.0, sent=20),
            {"t": t + 5.5, "event": "fault_reverted", "id": 1, "type": "process.cpu_throttle", "error": None},
            {"t": t + 6, "event": "state", "state": "hypothesis_after"},
            sample(6.5, "after", "ok", p50_ms=10.0, p99_ms=25.0, error_rate=0.0, sent=20),
            {"t": t + 7, "event": "recovered", "seconds": 0.5},
            {"t": t + 7, "event": "end", "verdict": "deviated", "exit_code": 1, "reason": "",
             "deviations": ["sla deviated"], "recovery_s": 0.5}]


def _events(lines):
    return [from_json(line) for line in lines]


def test_report_panels_from_journal_events():
    view = run_view(_events(_journal()))
    assert view.verdict == "deviated" and view.faults[0].reverted_at == T0 + 5.5
    main, extra = panels_for(view, "sla")
    titles = [p.title for p in main]
    assert titles[0] == "percentiles (ms)" and "error_rate" in titles
    assert [p.title for p in extra] == ["sent"]
    rate = next(p for p in main if p.title == "error_rate")
    assert {ln.kind for ln in rate.lines} == {"tolerance", "safeguard"}
    states = {round(m.t - T0, 3): (m.state, m.judged) for m in rate.series[0].marks}
    assert states[2.0] == ("fail", True) and states[4.0] == ("ok", False) and states[0.2] == ("ok", True)
    pct = main[0]
    p99 = next(s for s in pct.series if s.key == "p99_ms")
    assert [m.state for m in p99.marks] == ["ok", "ok", "fail", "ok"]  # 800 < 950 holds; 990 (grace) does not


def test_the_all_requests_percentiles_head_the_report():
    """With all_* keys the headline percentile panel is the all-requests one; the successes-only one moves to
    the other panels and says what it is."""
    lines = _journal()
    for line in lines:
        if line["event"] == "sample":
            line["values"].update(all_p50_ms=12.0, all_p99_ms=800.0)
    lines[0]["expect"] = {"sla": {"error_rate": {"kind": "cmp", "op": "<", "value": 0.01}}}
    main, extra = panels_for(run_view(_events(lines)), "sla")
    assert [p.title for p in main][:2] == ["error_rate", "percentiles (ms, all requests)"]
    assert "percentiles (ms, successes only)" in [p.title for p in extra]


def test_the_last_run_of_a_journal_written_twice():
    events = _events(_journal() + [dict(e, t=e["t"] + 100) for e in _journal()])
    assert len(last_run(events)) == len(_journal()) and last_run(events)[0].event == "experiment"
    html_text = render(run_view(events))
    assert html_text == render(run_view(last_run(events)))
    assert html_text != render(run_view(events[:len(_journal())]))  # the first run's times differ
    assert "fault-window" in html_text and "<script" not in html_text
