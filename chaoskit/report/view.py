"""A run as its journal events tell it (RunView), so `chaoskit report JOURNAL` gives the report the run wrote:
the outcome, the phases, each fault with its apply/revert times and what observe() saw, every sample, the
tolerances and safeguard rules, the host facts and the experiment after substitution; and a suite's rows."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from chaoskit.model.enums import Phase, RunVerdict, Verdict
from chaoskit.model.events import (
    ErrorNoted,
    Event,
    ExperimentRecorded,
    FaultApplied,
    FaultObserved,
    FaultReverted,
    HostFacts,
    Interrupted,
    LateApplyReverted,
    OperatorChose,
    Planned,
    PlanStep,
    Recovered,
    RevertFailed,
    RolledBack,
    RunEnded,
    RunStarted,
    SafeguardRecord,
    SafeguardTripped,
    Sample,
    StateChanged,
    TargetExited,
    WatchdogDied,
    WatchdogStarted,
)
from chaoskit.model.faults import AppliedFault
from chaoskit.model.tolerance import Tolerance
from chaoskit.report.detection import Detection, detection

TABLE_ORDER = (Phase.BEFORE, Phase.DURING, Phase.GRACE, Phase.BETWEEN, Phase.SAFEGUARD, Phase.AFTER, Phase.INTERIM)
NOTE_EVENTS = (SafeguardTripped, Interrupted, ErrorNoted, WatchdogDied, RevertFailed, LateApplyReverted,
               OperatorChose)


@dataclass
class RunView:
    """One run as its events tell it: what every rendering (summary.json, HTML, Markdown, the live view, a suite's
    table) shows. Events are added one by one (`add`), so a live display folds them as they come."""

    run_id: str = ""
    experiment: str = ""
    description: str = ""
    file: str = ""
    started: float = 0.0
    ended: float = 0.0
    complete: bool = False  # the journal has the run's end (a killed run's journal has not)
    verdict: RunVerdict = RunVerdict.UNFINISHED
    exit_code: int | None = None
    reason: str = ""
    deviations: list[str] = field(default_factory=list)
    recovery_s: float | None = None
    recovered_at: float | None = None
    ledger: str | None = None
    states: list[tuple[str, float]] = field(default_factory=list)
    plan: list[PlanStep] = field(default_factory=list)
    faults: list[AppliedFault] = field(default_factory=list)
    samples: list[Sample] = field(default_factory=list)
    expects: dict[str, dict[str, Tolerance]] = field(default_factory=dict)  # probe -> key -> tolerance
    safeguards: list[SafeguardRecord] = field(default_factory=list)
    host: HostFacts | None = None
    document: Any = None
    variables: dict[str, Any] = field(default_factory=dict)
    notes: list[tuple[float, str, str]] = field(default_factory=list)  # (t, event, text)
    tripped: dict[str, str] = field(default_factory=dict)  # safeguard probe -> why it tripped
    counts: dict[str, dict[str, tuple[int, int]]] = field(default_factory=dict)  # probe -> phase -> (n, failed)
    keep: int | None = None  # the live view keeps only the latest samples of each probe

    @property
    def state(self) -> str:
        return self.states[-1][0] if self.states else "pending"

    @property
    def rollback_complete(self) -> bool:
        return self.verdict is not RunVerdict.ROLLBACK_INCOMPLETE and not any(f.revert_error for f in self.faults)

    def active_faults(self) -> list[AppliedFault]:
        return [f for f in self.faults if f.applied_at is not None and f.reverted_at is None]

    def detection(self) -> Detection:
        """Per alert the alert probes expect: time to detect and to resolve each fault (MTTD/MTTR), noisy rules."""
        return detection(self.document, self.faults, self.samples)

    def probes(self) -> list[str]:
        """Probe names in the order of the experiment, then any others that were sampled."""
        sampled = {s.probe for s in self.samples}
        names = [n for n in self.expects if n in sampled] + [s.probe for s in self.samples]
        return list(dict.fromkeys(names))

    def phase_outcome(self, probe: str, phase: str) -> str:
        """How the engine judged `probe` in `phase`, as the run's deviations have it (never judged again here):
        `fail`, `ok`, `unjudged` (grace, between, interim and safeguard samples are never judged) or `undecided`
        (an after phase that is still going, or was interrupted). Before and during, every sample that did not
        hold is a deviation. The after phase is judged as a whole: ok once the steady state held again, however
        many samples failed before that within steadyState.after.within; failed when the run ended deviated
        without it, for each probe whose last after sample did not hold."""
        n, bad = self.counts.get(probe, {}).get(Phase(phase), (0, 0))
        if not Phase(phase).judged:
            return "unjudged"
        if phase != Phase.AFTER:
            return "fail" if bad else "ok"
        if self.recovered_at is not None or not bad:
            return "ok"
        if not self.complete or self.verdict is not RunVerdict.DEVIATED:
            return "undecided"
        last = next((s for s in reversed(self.samples) if s.probe == probe and s.phase is Phase.AFTER), None)
        return "fail" if last is not None and last.verdict is not Verdict.OK else "ok"

    def add(self, ev: Event) -> None:
        """Fold one event into the view."""
        if isinstance(ev, (FaultApplied, FaultObserved, FaultReverted, RevertFailed, TargetExited)):
            self._fault_event(ev)
        elif isinstance(ev, Sample):
            self._sample(ev)
        else:
            self._run_event(ev)
        if isinstance(ev, NOTE_EVENTS):
            self.notes.append((ev.t, ev.event, ev.shown()))
        if not self.complete:
            self.ended = max(self.ended, ev.t)

    def _sample(self, s: Sample) -> None:
        n, bad = self.counts.setdefault(s.probe, {}).get(s.phase, (0, 0))
        self.counts[s.probe][s.phase] = (n + 1, bad + (s.verdict is not Verdict.OK))
        self.samples.append(s)
        if self.keep is not None and sum(x.probe == s.probe for x in self.samples) > self.keep:
            self.samples.remove(next(x for x in self.samples if x.probe == s.probe))

    def _run_event(self, ev: Event) -> None:
        if isinstance(ev, ExperimentRecorded):
            self.file, self.document, self.variables = ev.file, ev.document, ev.vars
            self.expects, self.safeguards, self.description = ev.tolerances(), ev.safeguards, ev.description
        elif isinstance(ev, HostFacts):
            self.host = ev
        elif isinstance(ev, RunStarted):
            self.run_id, self.experiment, self.started = ev.run_id, ev.experiment, ev.t
            self.states = [("pending", ev.t)]
        elif isinstance(ev, StateChanged):
            self.states.append((ev.state, ev.t))
        elif isinstance(ev, Planned):
            self.plan = list(ev.steps)
        elif isinstance(ev, (WatchdogStarted, RolledBack)):
            self.ledger = self.ledger or ev.ledger
        elif isinstance(ev, SafeguardTripped):
            self.tripped[ev.probe] = ev.reason
        elif isinstance(ev, Recovered):
            self.recovered_at, self.recovery_s = ev.t, ev.seconds
        elif isinstance(ev, RunEnded):
            self.complete, self.ended = True, ev.t
            self.verdict, self.exit_code, self.reason = ev.verdict, ev.exit_code, ev.reason
            self.deviations, self.recovery_s = list(ev.deviations), ev.recovery_s

    def _fault_event(self, ev: FaultApplied | FaultObserved | FaultReverted | RevertFailed | TargetExited) -> None:
        if isinstance(ev, FaultApplied):
            self.faults = sorted([*(f for f in self.faults if f.id != ev.id), AppliedFault.from_event(ev)],
                                 key=lambda f: f.id)
            return
        fault = next((f for f in self.faults if f.id == ev.id), None)
        if fault is None:
            return
        if isinstance(ev, FaultObserved):
            fault.observed[ev.when] = ev.details
        elif isinstance(ev, FaultReverted):
            fault.reverted_at = ev.t
        elif isinstance(ev, RevertFailed):
            fault.revert_error = ev.error or "revert failed"
        else:  # a target that exited during its fault: on the fault, and among the run's events
            fault.exits.append(ev)
            self.notes.append((ev.t, ev.event, f"fault #{fault.id} {fault.step} ({fault.type}): {ev.text}"))


@dataclass(frozen=True)
class SuiteRow:
    """One experiment of a suite as its table, index and Markdown show it (exit_code None: not run)."""

    experiment: str
    file: str
    verdict: str
    exit_code: int | None
    duration_s: float = 0.0
    deviations: tuple[str, ...] = ()
    reason: str = ""
    report: str | None = None

    @classmethod
    def of_run(cls, view: RunView, file: str, exit_code: int, report: str | None) -> SuiteRow:
        return cls(view.experiment, file, view.verdict, exit_code, round(view.ended - view.started, 3),
                   tuple(view.deviations), view.reason, report)

    def why(self) -> str:
        return "; ".join(self.deviations) or self.reason


def last_run(events: list[Event]) -> list[Event]:
    """A journal appended to by several runs (the same --journal twice): the events of the last one, with the
    experiment and host records written just before it."""
    runs = [i for i, ev in enumerate(events) if isinstance(ev, RunStarted)]
    if not runs:
        return events
    start = runs[-1]
    while start > 0 and isinstance(events[start - 1], (ExperimentRecorded, HostFacts)):
        start -= 1
    return events[start:]


def run_view(events: list[Event]) -> RunView:
    v = RunView()
    for ev in last_run(events):
        v.add(ev)
    if not v.experiment and isinstance(v.document, dict):
        v.experiment = str((v.document.get("metadata") or {}).get("name", ""))
    return v


def phase_table(view: RunView) -> tuple[list[str], dict[str, dict[str, tuple[int, int]]]]:
    """(the phases sampled, in run order; probe -> phase -> (samples, failed))."""
    sampled = {phase for phases in view.counts.values() for phase in phases}
    return [p.value for p in TABLE_ORDER if p in sampled], view.counts


def counted(n: int, bad: int, outcome: str) -> str:
    """A phase table's cell: `2/5 failed`, `5/5 ok`; an after phase that held again after failing says so."""
    if not bad:
        return f"{n}/{n} ok"
    return f"{bad}/{n} failed" + (", then held again" if outcome == "ok" else "")
