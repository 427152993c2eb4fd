"""RunMetrics: a run's journal events folded into its own registry, exactly as a scrape shows them."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Gauge, generate_latest

from chaoskit.model.enums import Phase, RunVerdict, Verdict
from chaoskit.model.events import (
    ExperimentRecorded,
    FaultApplied,
    FaultReverted,
    Planned,
    PlanStep,
    RunEnded,
    Sample,
    StateChanged,
)
from chaoskit.observe.fault_labels import FaultLabels, target_of
from chaoskit.observe.metrics import RunMetrics

DOC = {"method": [{"name": "freeze", "inject": {"type": "process.signal", "pid": 42, "signal": "SIGSTOP"}},
                  {"parallel": [{"inject": {"type": "network.netem", "target": {"netns": "n1", "interface": "eth0"}}},
                                {"inject": {"type": "gpu.xid", "device": 0},
                                 "fallback": [{"type": "process.signal", "pid": [7, 8]}]}]}]}
PLAN = [PlanStep(step="freeze", type="process.signal", path="method[0]"),
        PlanStep(step="network.netem", type="network.netem", path="method[1].parallel[0]"),
        PlanStep(step="gpu.xid", type="process.signal", path="method[1].parallel[1]", variant="fallback 1")]
RUN = {"experiment": "e", "run_id": "r1"}


def test_the_target_label_is_what_the_step_spec_names_its_variant_included():
    assert [target_of(DOC, p) for p in PLAN] == ["42", "interface=eth0,netns=n1", "7,8"]
    assert target_of(DOC, PlanStep(step="x", path="method[9]")) == ""
    labels = FaultLabels(DOC, PLAN)
    assert labels.labels(FaultApplied(id=3, step="gpu.xid", type="process.signal")) == {
        "step": "gpu.xid", "type": "process.signal", "target": "7,8"}


def _value(m: RunMetrics, name: str, **labels: str) -> float | None:
    return m.registry.get_sample_value(name, {**RUN, **labels})


def test_a_run_folds_into_fault_windows_probe_values_phase_and_verdict():
    m = RunMetrics("e", "r1")
    fault = {"step": "freeze", "type": "process.signal", "target": "42"}
    assert _value(m, "chaoskit_run_verdict", verdict="unfinished") == 1
    for ev in (ExperimentRecorded(name="e", document=DOC), Planned(steps=PLAN), StateChanged(state="method"),
               FaultApplied(id=1, step="freeze", type="process.signal", applied_at=100.5)):
        m(ev)
    assert _value(m, "chaoskit_fault_active", **fault) == 1
    assert _value(m, "chaoskit_fault_applied_timestamp_seconds", **fault) == 100.5
    assert _value(m, "chaoskit_run_phase", phase="method") == 1
    assert _value(m, "chaoskit_run_phase", phase="pending") == 0
    m(Sample(probe="p", phase=Phase.DURING, verdict=Verdict.FAIL,
             values={"p99_ms": 12.5, "ok": True, "state.A": "firing", "none": None}))
    assert _value(m, "chaoskit_probe_value", probe="p", key="p99_ms") == 12.5
    assert _value(m, "chaoskit_probe_value", probe="p", key="ok") == 1
    assert _value(m, "chaoskit_probe_value", probe="p", key="state.A") is None
    assert _value(m, "chaoskit_probe_sample_ok", probe="p", phase="during") == 0
    m(FaultReverted(t=104.5, id=1, type="process.signal"))
    m(FaultReverted(t=105.0, id=99, type="x"))  # not one of this run's: ignored
    assert _value(m, "chaoskit_fault_active", **fault) == 0
    assert _value(m, "chaoskit_fault_reverted_timestamp_seconds", **fault) == 104.5
    m(RunEnded(verdict=RunVerdict.DEVIATED, exit_code=1))
    assert _value(m, "chaoskit_run_verdict", verdict="deviated") == 1
    assert _value(m, "chaoskit_run_verdict", verdict="unfinished") == 0
    assert _value(m, "chaoskit_run_exit_code") == 1


def test_each_run_has_its_own_registry_and_nothing_goes_to_the_global_one():
    from prometheus_client import REGISTRY

    a, b = RunMetrics("e", "a"), RunMetrics("e", "b")
    a(FaultApplied(id=1, step="s", type="t", applied_at=1.0))
    assert b"run_id=\"a\"" in generate_latest(a.registry) and b"run_id=\"a\"" not in generate_latest(b.registry)
    assert REGISTRY.get_sample_value("chaoskit_fault_active", {**RUN, "step": "s", "type": "t", "target": ""}) is None
    other = CollectorRegistry()
    Gauge("chaoskit_fault_active", "a name free in any other registry", registry=other)  # no clash: not global
