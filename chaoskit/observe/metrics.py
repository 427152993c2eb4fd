"""A run as Prometheus metrics: its own CollectorRegistry (no global state), folded from the journal's events."""

from __future__ import annotations

import math
import threading

from prometheus_client import CollectorRegistry, Gauge

from chaoskit.engine.states import State
from chaoskit.model.enums import RunVerdict, Verdict
from chaoskit.model.events import (
    Event,
    ExperimentRecorded,
    FaultApplied,
    FaultReverted,
    Planned,
    RunEnded,
    Sample,
    StateChanged,
)
from chaoskit.observe.fault_labels import FaultLabels

RUN = ("experiment", "run_id")
FAULT = (*RUN, "step", "type", "target")


def number(value: object) -> float | None:
    """A probe value as a sample value (a bool is 1/0); None for text, maps, nothing and NaN."""
    if isinstance(value, bool):
        return float(value)
    if isinstance(value, (int, float)) and not math.isnan(float(value)):
        return float(value)
    return None


class RunMetrics:
    """The gauges of one run; call it with each journal event (a Journal sink)."""

    def __init__(self, experiment: str, run_id: str):
        self.registry = CollectorRegistry(auto_describe=True)
        self.run = {"experiment": experiment, "run_id": run_id}
        r = self.registry
        self.fault_active = Gauge("chaoskit_fault_active", "1 while the fault is in effect, 0 after its revert",
                                  FAULT, registry=r)
        self.fault_applied = Gauge("chaoskit_fault_applied_timestamp_seconds",
                                   "when the fault was applied (Unix time)", FAULT, registry=r)
        self.fault_reverted = Gauge("chaoskit_fault_reverted_timestamp_seconds",
                                    "when the fault was reverted (Unix time)", FAULT, registry=r)
        self.probe_value = Gauge("chaoskit_probe_value", "the latest numeric value the probe measured",
                                 (*RUN, "probe", "key"), registry=r)
        self.sample_ok = Gauge("chaoskit_probe_sample_ok", "1 when the probe's latest sample in this phase was "
                               "ok, 0 when it failed or was an error", (*RUN, "probe", "phase"), registry=r)
        self.key_ok = Gauge("chaoskit_probe_judgement_ok", "1 when the engine judged the key ok in the probe's "
                            "latest sample of this phase, 0 when it failed", (*RUN, "probe", "key", "phase"),
                            registry=r)
        self.threshold = Gauge("chaoskit_probe_threshold", "what the engine compared the key with in the probe's "
                               "latest sample judged against a number (a baseline rule's, resolved)",
                               (*RUN, "probe", "key"), registry=r)
        self.phase = Gauge("chaoskit_run_phase", "1 for the state the run is in, 0 for the others",
                           (*RUN, "phase"), registry=r)
        self.verdict = Gauge("chaoskit_run_verdict", "1 for the run's verdict (unfinished until it ends)",
                             (*RUN, "verdict"), registry=r)
        self.exit_code = Gauge("chaoskit_run_exit_code", "the run's exit code once it ended", RUN, registry=r)
        for state in State:
            self.phase.labels(**self.run, phase=state.value).set(state is State.PENDING)
        for verdict in RunVerdict:
            self.verdict.labels(**self.run, verdict=verdict.value).set(verdict is RunVerdict.UNFINISHED)
        self._lock = threading.Lock()  # revert threads journal too
        self._names = FaultLabels()
        self._faults: dict[int, tuple[str, ...]] = {}  # fault id -> its label values
        self._active: dict[tuple[str, ...], set[int]] = {}  # label values -> the faults with them in effect

    def __call__(self, ev: Event) -> None:
        with self._lock:
            if isinstance(ev, ExperimentRecorded):
                self._names.document = ev.document
            elif isinstance(ev, Planned):
                self._names.plan = list(ev.steps)
            elif isinstance(ev, (FaultApplied, FaultReverted)):
                self._fault(ev)
            elif isinstance(ev, Sample):
                self._sample(ev)
            elif isinstance(ev, StateChanged):
                self._state(ev.state)
            elif isinstance(ev, RunEnded):
                self._ended(ev)

    def _fault(self, ev: FaultApplied | FaultReverted) -> None:
        if isinstance(ev, FaultApplied):
            values = (*self.run.values(), *self._names.labels(ev).values())
            self._faults[ev.id] = values
            self._active.setdefault(values, set()).add(ev.id)
            self.fault_applied.labels(*values).set(ev.applied_at or ev.t)
        elif (values := self._faults.get(ev.id)) is not None:
            self._active[values].discard(ev.id)
            self.fault_reverted.labels(*values).set(ev.t)
        else:
            return
        self.fault_active.labels(*values).set(1 if self._active[values] else 0)

    def _sample(self, s: Sample) -> None:
        self.sample_ok.labels(**self.run, probe=s.probe, phase=s.phase.value).set(s.verdict is Verdict.OK)
        for key, value in s.values.items():
            v = number(value)
            if v is not None:
                self.probe_value.labels(**self.run, probe=s.probe, key=key).set(v)
        for j in s.judgements or ():  # the engine's judgement of each key, as it made it
            self.key_ok.labels(**self.run, probe=s.probe, key=j.key, phase=s.phase.value).set(j.ok)
            if j.threshold is not None:
                self.threshold.labels(**self.run, probe=s.probe, key=j.key).set(j.threshold)

    def _state(self, state: str) -> None:
        for known in State:
            self.phase.labels(**self.run, phase=known.value).set(known.value == state)

    def _ended(self, ev: RunEnded) -> None:
        for verdict in RunVerdict:
            self.verdict.labels(**self.run, verdict=verdict.value).set(verdict == ev.verdict)
        self.exit_code.labels(**self.run).set(ev.exit_code)
