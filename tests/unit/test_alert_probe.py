"""The alert probe against a small local alerts API (Prometheus and Alertmanager answers), its fault windows fed
as the journal would; the report's time to detect and resolve from such samples."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from pydantic import ValidationError

from chaoskit.engine.steady_state import take_sample
from chaoskit.model.enums import Phase, Verdict
from chaoskit.model.events import FaultApplied, FaultReverted, Sample
from chaoskit.model.faults import AppliedFault
from chaoskit.probes import probe_class
from chaoskit.probes.alert import EXAMPLE, AlertProbe, AlertProbeSpec, Track, parse_alerts
from chaoskit.report.detection import detection

A = {"alertname": "HighErrors", "service": "gw"}


class _Alerts(BaseHTTPRequestHandler):
    answer: list = []  # (labels, state) of the active alerts; set by the test

    def do_GET(self) -> None:  # noqa: N802
        if self.path == "/api/v1/alerts":
            body = {"status": "success", "data": {"alerts": [{"labels": lb, "state": st} for lb, st in self.answer]}}
        else:
            body = [{"labels": lb, "status": {"state": "active"}, "endsAt": "2999-01-01T00:00:00Z"}
                    for lb, st in self.answer if st == "firing"]
        data = json.dumps(body).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *_args: object) -> None:
        pass


@pytest.fixture
def server() -> Iterator[str]:
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _Alerts)
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    _Alerts.answer = []
    yield f"http://127.0.0.1:{srv.server_address[1]}"
    srv.shutdown()
    srv.server_close()
    thread.join(2)


def _probe(url: str, **kw: object) -> AlertProbe:
    spec = AlertProbeSpec(type="alert", name="alerts", url=url, alerts=[{"name": "HighErrors",
                                                                         "labels": {"service": "gw"}}], **kw)
    return AlertProbe(spec)


def _sample(probe: AlertProbe, phase: Phase = Phase.DURING) -> Sample:
    """One sample in a loop of its own (the probe's session is closed with it)."""
    async def one() -> Sample:
        try:
            return await take_sample(probe, phase)
        finally:
            await probe.close()

    return asyncio.run(one())


def test_the_spec_defaults_its_expect_and_refuses_what_it_cannot_judge():
    spec = AlertProbeSpec.model_validate(EXAMPLE)
    assert {k: str(v) for k, v in spec.expect.items()} == {"late": "~ ^$", "waiting": "== 0"}
    assert (spec.detect_within, spec.resolve_within, spec.timeout) == (30.0, 120.0, 5.0)
    assert probe_class("alert") is AlertProbe
    with pytest.raises(ValidationError, match="HighErrors expected twice; give each an id"):
        AlertProbeSpec(type="alert", name="a", url="http://x", alerts=[{"name": "HighErrors"}, {"name": "HighErrors"}])
    with pytest.raises(ValidationError, match="did you mean 'overdue'"):
        AlertProbeSpec(type="alert", name="a", url="http://x", alerts=[{"name": "A"}], expect={"overdu": "== 0"})


def test_a_resolve_within_longer_than_the_after_phase_is_noted_before_the_run():
    spec = AlertProbeSpec.model_validate({**EXAMPLE, "resolve_within": "10s"})
    assert spec.after_notes(2.0) == [f"probe {spec.name}: resolve_within 10s is longer than steadyState.after.within "
                                     "2s: the after phase stops waiting for its alerts to resolve before that"]
    assert spec.after_notes(10.0) == []
    assert spec.model_copy(update={"phases": ["before", "during"]}).after_notes(2.0) == []  # no after phase


def test_a_fault_detected_in_time_holds_then_the_after_phase_waits_for_the_resolution(server):
    p = _probe(server, detect_within="5s", resolve_within="5s")
    s = _sample(p, Phase.BEFORE)
    assert s.verdict is Verdict.OK and s.values["state.HighErrors"] == "inactive" and s.values["noisy"] == 0
    p.note_fault(FaultApplied(id=1, step="freeze", type="process.signal", applied_at=time.time()))
    _Alerts.answer = [({**A, "pod": "x"}, "pending")]
    s = _sample(p)
    assert (s.values["state.HighErrors"], s.values["pending.HighErrors"], s.values["firing.HighErrors"]) == (
        "pending", 1, 0)
    _Alerts.answer = [({**A, "pod": "x"}, "firing")]
    s = _sample(p)
    assert s.verdict is Verdict.OK and s.values["firing.HighErrors"] == 1 and 0 <= s.values["detect_s.HighErrors"] < 1
    p.note_fault(FaultReverted(id=1, type="process.signal"))
    s = _sample(p, Phase.AFTER)
    assert s.verdict is Verdict.FAIL and s.values["waiting"] == 1 and s.details[0] == "waiting: 1 == 0 is false"
    _Alerts.answer = []
    s = _sample(p, Phase.AFTER)
    assert s.verdict is Verdict.OK and s.values["state.HighErrors"] == "resolved" and s.values["waiting"] == 0
    assert s.values["resolve_s.HighErrors"] >= 0 and s.values["late"] == ""


def test_a_missed_deadline_is_late_with_the_reason_and_stays_so(server):
    p = _probe(server, detect_within="0.2s")
    p.note_fault(FaultApplied(id=3, step="freeze", type="process.signal", applied_at=time.time()))
    _Alerts.answer = [({"alertname": "HighErrors", "service": "other"}, "firing")]  # not the labels expected
    time.sleep(0.3)
    s = _sample(p)
    assert s.verdict is Verdict.FAIL and s.values["overdue"] == 1
    assert s.values["late"] == "HighErrors: not firing fault #3 freeze's apply (detect_within 0.2s)"
    _Alerts.answer = [(A, "firing")]
    s = _sample(p)
    assert s.values["overdue"] == 1 and s.values["firing.HighErrors"] == 1  # fired, but late: still late


def test_an_alert_active_before_any_fault_is_noisy_and_a_step_filter_ignores_other_faults(server):
    p = _probe(server, steps=["freeze"])
    _Alerts.answer = [(A, "firing")]
    assert _sample(p, Phase.BEFORE).values["noisy"] == 1
    p.note_fault(FaultApplied(id=1, step="other", type="x", applied_at=time.time()))
    assert _sample(p).values["waiting"] == 0 and p._tracks == []


def test_an_unreachable_source_is_source_up_0_never_a_failed_sample():
    p = _probe("http://127.0.0.1:1", timeout="1s")
    s = _sample(p)
    assert s.verdict is Verdict.OK and s.values["source_up"] == 0 and "source_error" in s.values
    assert "state.HighErrors" not in s.values


def test_alertmanager_answers_read_as_firing_and_ended_alerts_are_gone(server):
    now = time.time()
    data = [{"labels": A, "endsAt": "2999-01-01T00:00:00Z"}, {"labels": {"alertname": "Old"},
                                                              "endsAt": "2000-01-01T00:00:00Z"}]
    assert parse_alerts("alertmanager", data, now) == [(A, "firing")]
    with pytest.raises(RuntimeError, match="Prometheus answered"):
        parse_alerts("prometheus", {"status": "error"}, now)
    p = _probe(server, source="alertmanager")
    _Alerts.answer = [(A, "firing")]
    assert _sample(p).values["firing.HighErrors"] == 1


def test_track_resolution_deadline():
    t = Track("A", 1, "s", applied_at=10.0, detect_within=5, resolve_within=2, reverted_at=20.0)
    t.read(9.0, "inactive")
    t.read(12.0, "firing")
    t.read(21.0, "firing")
    assert t.late is None and t.undecided
    t.read(22.5, "firing")
    assert t.late == "A: still active fault #1 s's revert (resolve_within 2s)"


def _s(t: float, state: str) -> Sample:
    return Sample(t=t, probe="alerts", phase=Phase.DURING, verdict=Verdict.OK, values={"state.HighErrors": state},
                  duration_ms=100.0)


def test_the_report_computes_ttd_ttr_mttd_and_the_noisy_rule_from_samples_and_windows():
    doc = {"steadyState": {"probes": [{"name": "alerts", "type": "alert", "url": "http://x", "detect_within": "5s",
                                       "resolve_within": "5s", "alerts": [{"name": "HighErrors"}]}]}}
    faults = [AppliedFault(1, "a", "t", applied_at=100.0, reverted_at=110.0),
              AppliedFault(2, "b", "t", applied_at=200.0, reverted_at=210.0)]
    samples = [_s(90, "firing"), _s(95, "inactive"),  # noisy before any fault
               _s(101, "pending"), _s(102.9, "firing"), _s(110.9, "firing"), _s(111.9, "resolved"),
               _s(201, "inactive"), _s(206, "inactive"), _s(216, "inactive")]
    found = detection(doc, faults, samples)
    assert [(o.fault, o.detected, o.detect_s, o.resolved, o.resolve_s) for o in found.outcomes] == [
        (1, "detected", 3.0, "resolved", 2.0), (2, "missed", None, "-", None)]
    assert (found.mttd_s, found.mttr_s) == (3.0, 2.0)
    assert [(n.alert, n.t, n.state) for n in found.noisy] == [("HighErrors", 90.1, "firing")]
    assert found.outcomes[0].text() == "HighErrors (alerts): detected in 3s (≤ 5s), resolved in 2s (≤ 5s)"
    assert found.outcomes[1].text() == "HighErrors (alerts): missed (≤ 5s)"


def test_the_html_and_markdown_reports_show_the_times_beside_the_fault_and_the_noisy_rule():
    from chaoskit.report import html, markdown
    from chaoskit.report.view import RunView

    doc = {"steadyState": {"probes": [{"name": "alerts", "type": "alert", "url": "http://x", "detect_within": "5s",
                                       "alerts": [{"name": "HighErrors"}]}]}}
    view = RunView(experiment="e", started=80.0, ended=130.0, document=doc, states=[("pending", 80.0)],
                   faults=[AppliedFault(1, "freeze", "t", applied_at=100.0, reverted_at=110.0)],
                   samples=[_s(90, "pending"), _s(95, "inactive"), _s(102.9, "firing"), _s(111.9, "resolved")])
    page, md = html.render(view), markdown.render(view)
    assert "<td class='alerts'>HighErrors (alerts): detected in 3s (≤ 5s), resolved in 2s (≤ 120s)</td>" in page
    assert "MTTD 3s</b> · <b>MTTR 2s" in page and "was pending at +10.10s, before any fault" in page
    assert "| #1 freeze | HighErrors (alerts) | detected 3s (≤ 5s) | resolved 2s (≤ 120s) |" in md
    assert "- noisy rule: HighErrors (alerts) was pending at +10.10s, before any fault" in md
