"""What a report shows, rebuilt from a run's journal events alone, so `chaoskit report JOURNAL` gives the report
the run wrote: the outcome, the phases, each fault with its apply/revert times and what observe() saw, every
sample, the tolerances and safeguard rules, the host facts and the experiment after substitution; and per probe
the chart panels (which measurements, their tolerance lines, which samples deviated)."""

from __future__ import annotations

import math
import re
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
from chaoskit.report.charts import Line, Mark, Moment, Panel, Series, Window

PHASE_LABEL = {"hypothesis_before": "before", "method": "method", "rollback": "rollback",
               "hypothesis_after": "after", "preflight": "preflight"}
HEADLINE = ("percentiles (ms)", "error_rate", "goodput_rps", "latency_ms", "value", "rate", "count",
            "memory_used_share", "exit_code", "duration_ms")
MAX_EXTRA_PANELS = 24
TABLE_ORDER = (Phase.BEFORE, Phase.DURING, Phase.GRACE, Phase.BETWEEN, Phase.SAFEGUARD, Phase.AFTER, Phase.INTERIM)
NOTE_EVENTS = (SafeguardTripped, Interrupted, ErrorNoted, WatchdogDied, RevertFailed, LateApplyReverted,
               OperatorChose)
_PCT = re.compile(r"^(?P<prefix>(?:[a-z]+_)?)p(?:50|90|99|999)_(?P<unit>ms|us)$")
_GROUP = re.compile(r"^(?P<key>[^\[\]]+)\[(?P<group>[^\[\]]+)\]$")


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

    def probes(self) -> list[str]:
        """Probe names in the order of the experiment, then any others that were sampled."""
        sampled = {s.probe for s in self.samples}
        names = [n for n in self.expects if n in sampled] + [s.probe for s in self.samples]
        return list(dict.fromkeys(names))

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


# -- what the charts show -------------------------------------------------------------------------------------
def number(value: Any) -> float | None:
    """A finite number, or None (booleans and text are no numbers; numeric text such as a header value is)."""
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, str):
        try:
            value = float(value.strip())
        except ValueError:
            return None
    if isinstance(value, (int, float)) and math.isfinite(float(value)):
        return float(value)
    return None


def family(key: str) -> str:
    """Keys drawn in one panel: p50/p90/p99/p999 of one kind together, each group_by key across its groups."""
    if m := _GROUP.match(key):
        return f"{m.group('key')} by group"
    if m := _PCT.match(key):
        return f"{m.group('prefix')}percentiles ({m.group('unit')})"
    return key


def baseline_of(view: RunView, probe: str, key: str) -> float | None:
    for s in view.samples:
        if s.probe == probe and s.phase is Phase.BEFORE:
            return number(s.values.get(key))
    return None


def thresholds(tol: Tolerance, baseline: float | None) -> list[tuple[float, str]]:
    """The numbers a tolerance compares with, each with how it reads ('< 950', '<= 3x baseline = 361.5'): the
    lines a chart draws."""
    if tol.kind == "range":
        return [(tol.low, f">= {tol.low:g}"), (tol.high, f"<= {tol.high:g}")]
    if tol.kind == "baseline" and baseline is not None:
        value = tol.value.scale * baseline + tol.value.offset
        return [(value, f"{tol.op} {tol.value.text} = {value:g}")]
    if tol.kind in ("cmp", "eq") and isinstance(tol.value, (int, float)) and not isinstance(tol.value, bool):
        return [(float(tol.value), f"{tol.op} {float(tol.value):g}")]
    return []


def panels_for(view: RunView, probe: str) -> tuple[list[Panel], list[Panel]]:
    """(the main panels: what the probe expects and the headline measurements; the other numeric ones)."""
    samples = [s for s in view.samples if s.probe == probe]
    expect = view.expects.get(probe, {})
    keys: dict[str, None] = {}  # numbers only; text counts where a tolerance reads it as one (a header)
    for s in samples:
        for k, val in s.values.items():
            if number(val) is not None and (k in expect or not isinstance(val, str)):
                keys[k] = None
    families: dict[str, list[str]] = {}
    for k in keys:
        families.setdefault(family(k), []).append(k)
    main = [f for f in families if any(k in expect for k in families[f])]
    main += [f for f in HEADLINE if f in families and f not in main]
    extra = [f for f in families if f not in main][:MAX_EXTRA_PANELS]
    guards = [rule for g in view.safeguards if g.probe == probe for rule in g.rules]
    return ([_panel(view, probe, f, families[f], samples, expect, guards) for f in main],
            [_panel(view, probe, f, families[f], samples, expect, guards) for f in extra])


def mark_state(sample: Sample, key: str, tol: Tolerance | None, baseline: float | None) -> str:
    """How a chart marks one measurement: error (the sample is one), fail (its tolerance does not hold), ok."""
    if sample.verdict is Verdict.ERROR:
        return "error"
    if tol is None or key not in sample.values:
        return "ok"
    return "ok" if tol.check(sample.values[key], baseline)[0] else "fail"


def _panel(view: RunView, probe: str, fam: str, keys: list[str], samples: list[Sample],
           expect: dict[str, Tolerance], guards: list[Any]) -> Panel:
    t0 = view.started
    series, lines = [], []
    for key in keys:
        tol, base = expect.get(key), baseline_of(view, probe, key)
        marks = []
        for s in samples:
            value = number(s.values.get(key))
            state = mark_state(s, key, tol, base)
            if value is None and state != "error":
                continue  # the key was not measured in this sample (and it is no error sample)
            marks.append(Mark(s.t, value, state, s.phase.judged, _title(s, t0, key, value)))
        series.append(Series(probe, key, marks))
        if tol is not None:
            lines += [Line(v, f"{key} {text}" if len(keys) > 1 else text) for v, text in thresholds(tol, base)]
    for rule in guards:
        if rule.metric in keys and rule.value is not None:
            lines.append(Line(rule.value, f"abort if {rule.text}", "safeguard"))
    title = fam if len(keys) > 1 or fam != keys[0] else keys[0]
    return Panel(title, series, lines)


def _title(s: Sample, t0: float, key: str, value: float | None) -> str:
    what = f"{key} = {value:g}" if value is not None else (s.error or "no value")
    detail = next((d for d in s.details if d.startswith(f"{key}: ")), "")
    return (f"+{s.t - t0:.2f}s [{s.phase}] {s.verdict}: {what}" + (f" ({detail})" if detail else "")
            + f", took {s.duration_ms:.0f} ms")


def verdict_marks(view: RunView, probe: str) -> list[Mark]:
    return [Mark(s.t, None, s.verdict, s.phase.judged, f"+{s.t - view.started:.2f}s [{s.phase}] {s.verdict}: {s.why()}")
            for s in view.samples if s.probe == probe]


def fault_windows(view: RunView) -> list[Window]:
    out = []
    for f in view.faults:
        if f.applied_at is None:
            continue
        end = f.reverted_at or view.ended
        plan = next((p for p in view.plan if p.step == f.step), None)
        title = (f"#{f.id} {f.step} ({f.type}) applied +{f.applied_at - view.started:.2f}s, "
                 + (f"reverted +{f.reverted_at - view.started:.2f}s" if f.reverted_at else "not reverted")
                 + "".join(f"\n{c}" for c in (plan.changes if plan else [])))
        out.append(Window(f.applied_at, end, f"#{f.id} {f.step}", "fault", title, str(f.id)))
    return out


def phase_windows(view: RunView) -> list[Window]:
    out = []
    for (state, t), nxt in zip(view.states, [*view.states[1:], (None, view.ended)], strict=True):
        if state in PHASE_LABEL and nxt[1] > t:
            out.append(Window(t, nxt[1], PHASE_LABEL[state], state, f"{state} +{t - view.started:.2f}s "
                              f"for {nxt[1] - t:.2f}s"))
    return out


def moments(view: RunView) -> list[Moment]:
    out = []
    if view.recovered_at is not None:
        out.append(Moment(view.recovered_at, f"recovered {view.recovery_s or 0:g}s", "recovered"))
    for t, kind, _ in view.notes:
        if kind in ("safeguard", "interrupt"):
            out.append(Moment(t, "safeguard tripped" if kind == "safeguard" else "interrupted", kind))
    for f in view.faults:
        out += [Moment(e.seen_at, f"PID {e.pid} exited", e.event) for e in f.exits]
    return out


def phase_table(view: RunView) -> tuple[list[str], dict[str, dict[str, tuple[int, int]]]]:
    """(the phases sampled, in run order; probe -> phase -> (samples, failed))."""
    sampled = {phase for phases in view.counts.values() for phase in phases}
    return [p.value for p in TABLE_ORDER if p in sampled], view.counts
