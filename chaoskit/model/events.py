"""The catalogue of journal events: one frozen model per event, written as one JSON line each and read back
typed. Version 2 journals name their version in the `run` event; version 1 journals (no version) read the same,
their missing fields taking their defaults, and an event this catalogue does not know is kept as OtherEvent."""

from __future__ import annotations

import time
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, computed_field, model_serializer

from chaoskit.model.enums import Phase, RunVerdict, Verdict
from chaoskit.model.tolerance import Tolerance

JOURNAL_VERSION = 2
HIDDEN = ("traceback", "journal")  # fields left out where an event is shown as `name k=v ...`


def _now() -> float:
    return round(time.time(), 6)


class Event(BaseModel):
    """A journal line: when (`t`), which event, and the event's own fields."""

    model_config = ConfigDict(frozen=True, extra="ignore")
    OMIT_NONE: ClassVar[tuple[str, ...]] = ()  # fields written only when set

    t: float = Field(default_factory=_now)
    event: str

    def fields(self) -> dict[str, Any]:
        """The event's own fields, in order (what follows `t` and `event` on its line)."""
        data = self.model_dump(exclude={"t", "event"})
        return {k: v for k, v in data.items() if not (v is None and k in self.OMIT_NONE)}

    def to_json(self) -> dict[str, Any]:
        return {"t": self.t, "event": self.event, **self.fields()}

    def shown(self) -> str:
        """`k=v, ...` of the fields a person reads (a traceback and the journal version are left out)."""
        return ", ".join(f"{k}={v}" for k, v in self.fields().items() if k not in HIDDEN)


class OtherEvent(Event):
    """An event this catalogue does not know (a newer chaoskit's), kept as it was written."""

    data: dict[str, Any] = Field(default_factory=dict)

    def fields(self) -> dict[str, Any]:
        return dict(self.data)


# -- what the run is --------------------------------------------------------------------------------------------
class RuleRecord(BaseModel):
    """A safeguard rule as data: `metric op value` (value None: not a fixed number) and how it reads."""

    model_config = ConfigDict(frozen=True, extra="ignore")
    metric: str
    op: str
    value: float | None = None
    text: str = ""


class SafeguardRecord(BaseModel):
    model_config = ConfigDict(frozen=True, extra="ignore")
    probe: str
    rules: list[RuleRecord] = Field(default_factory=list)
    on_error: str | None = None


class ExperimentRecorded(Event):
    """The experiment exactly as run (after includes and substitution), its tolerances and safeguards."""

    event: Literal["experiment"] = "experiment"
    file: str = ""
    name: str = ""
    description: str = ""
    vars: dict[str, Any] = Field(default_factory=dict)
    document: Any = None
    expect: dict[str, dict[str, dict[str, Any]]] = Field(default_factory=dict)  # probe -> key -> Tolerance.to_json
    safeguards: list[SafeguardRecord] = Field(default_factory=list)

    def tolerances(self) -> dict[str, dict[str, Tolerance]]:
        return {probe: {key: Tolerance.from_json(t) for key, t in keys.items()} for probe, keys in self.expect.items()}


class DoctorCheck(BaseModel):
    model_config = ConfigDict(frozen=True, extra="ignore")
    area: str
    ok: bool
    detail: str = ""


class HostFacts(Event):
    """The host's facts: kernel, CPUs, memory, the quick doctor checks (a newer chaoskit's extra facts are kept)."""

    model_config = ConfigDict(frozen=True, extra="allow")
    OMIT_NONE = ("hostname", "kernel", "machine", "cpus", "memory_bytes", "python", "chaoskit", "euid")
    event: Literal["host"] = "host"
    hostname: str | None = None
    kernel: str | None = None
    machine: str | None = None
    cpus: int | None = None
    memory_bytes: int | None = None
    python: str | None = None
    chaoskit: str | None = None
    euid: int | None = None
    doctor: list[DoctorCheck] = Field(default_factory=list)
    doctor_skipped: list[str] = Field(default_factory=list)


class RunStarted(Event):
    event: Literal["run"] = "run"
    run_id: str = ""
    experiment: str = ""
    dry_run: bool = False
    journal: int = 1  # the catalogue's version the journal was written with (1: before it had one)


class StateChanged(Event):
    event: Literal["state"] = "state"
    state: str
    previous: str = ""
    reason: str = ""


class PlanStep(BaseModel):
    """One fault of the method as planned: `path` is the step's place in the experiment (`method[2].parallel[1]`),
    the same in every run of the file; `changes` says what it will change."""

    model_config = ConfigDict(frozen=True, extra="ignore")
    step: str
    duration_s: float | None = None
    changes: list[str] = Field(default_factory=list)
    variant: str | None = None  # a fallback chosen because the faults before it cannot run here
    passed_over: list[str] = Field(default_factory=list)
    type: str = ""
    path: str = ""  # empty in version 1 journals

    @model_serializer(mode="wrap")
    def _compact(self, handler: Any) -> dict[str, Any]:
        data = handler(self)
        return {k: v for k, v in data.items() if not (k in ("variant", "passed_over", "path") and not v)}


class Planned(Event):
    event: Literal["plan"] = "plan"
    steps: list[PlanStep] = Field(default_factory=list)


# -- what happened ----------------------------------------------------------------------------------------------
class Judgement(BaseModel):
    """The engine's judgement of one expected key of one sample, as every output shows it (none judges again):
    the value measured, the rule as written, the number it was compared with (a baseline rule's resolved:
    `< 3x baseline` with baseline 40 is threshold 120; a range's `low`..`high`), and the outcome. A before
    sample under a baseline rule is the baseline itself: ok, `baseline` set, no threshold."""

    model_config = ConfigDict(frozen=True, extra="ignore")
    key: str
    rule: str  # the tolerance as written: `< 3x baseline`, `1..2`, `~ ^ok$`, `== 200`
    value: Any = None  # as measured (None: not measured)
    threshold: float | None = None  # what the value was compared with (None: a range, a pattern, text, none)
    low: float | None = None  # a range's bounds
    high: float | None = None
    baseline: float | None = None  # a baseline rule's baseline: this key's value in the before phase
    outcome: Literal["ok", "fail"]
    why: str = ""  # the explanation, as `details` has it after `key: `

    @property
    def ok(self) -> bool:
        return self.outcome == "ok"

    def bound(self) -> str:
        """The rule with the number it came to: `< 3x baseline = 120`, `< 950`, `1..2`."""
        if self.baseline is not None and self.threshold is not None:
            return f"{self.rule} = {self.threshold:g}"
        return self.rule

    def bounds(self) -> list[tuple[float, str]]:
        """The numbers the value was compared with, each with how it reads: the lines a chart draws."""
        if self.low is not None and self.high is not None:
            return [(self.low, f">= {self.low:g}"), (self.high, f"<= {self.high:g}")]
        return [(self.threshold, self.bound())] if self.threshold is not None else []


class Sample(Event):
    """One probe sample and its verdict (`t`: when it started). `judgements`: the engine's judgement of each
    expected key, which every report shows and none makes again: `key`, `rule` (as written), `value`,
    `threshold` (what the value was compared with, a baseline rule's resolved), `low`/`high` (a range's),
    `baseline`, `outcome` (ok/fail), `why`. Absent in journals written before it; `details` says the same in
    words, for older readers."""

    OMIT_NONE = ("judgements",)
    event: Literal["sample"] = "sample"
    probe: str
    phase: Phase
    verdict: Verdict
    values: dict[str, Any] = Field(default_factory=dict)
    details: list[str] = Field(default_factory=list)  # one per judged key, failing ones first
    error: str | None = None
    duration_ms: float = 0.0
    judgements: list[Judgement] | None = None  # in the order of the probe's expect

    def why(self) -> str:
        return self.error or "; ".join(self.details)

    def judgement(self, key: str) -> Judgement | None:
        """The engine's judgement of `key` in this sample (None: not expected, an error, or an older journal)."""
        return next((j for j in self.judgements or () if j.key == key), None)


class Paused(Event):
    event: Literal["pause"] = "pause"
    seconds: float


class WatchdogStarted(Event):
    OMIT_NONE = ("respawned",)
    event: Literal["watchdog"] = "watchdog"
    pid: int
    ledger: str = ""
    respawned: bool | None = None
    escaped_to: list[str] = Field(default_factory=list)
    problems: list[str] = Field(default_factory=list)


class WatchdogDied(Event):
    event: Literal["watchdog_died"] = "watchdog_died"
    pid: int


class ErrorNoted(Event):
    OMIT_NONE = ("traceback",)
    event: Literal["error"] = "error"
    where: str
    error: str
    traceback: str | None = None


class Interrupted(Event):
    event: Literal["interrupt"] = "interrupt"
    signal: str


class SafeguardTripped(Event):
    event: Literal["safeguard"] = "safeguard"
    probe: str
    reason: str


class OperatorChose(Event):
    """--step: what the operator answered before a step (continue, skip, abort)."""

    event: Literal["operator"] = "operator"
    step: str
    choice: str


class FaultApplied(Event):
    OMIT_NONE = ("executor", "placement")
    event: Literal["fault_applied"] = "fault_applied"
    id: int
    step: str = ""
    type: str = ""
    duration_s: float | None = None
    applied_at: float | None = None
    reverted_at: float | None = None
    apply_ms: float | None = None
    executor: str | None = None
    placement: Any = None  # the chosen pods, nodes ... (an executor's own data)


class FaultObserved(Event):
    event: Literal["fault_observed"] = "fault_observed"
    id: int
    type: str = ""
    when: str = "?"  # applied | before_revert
    details: Any = None


class FaultReverted(Event):
    event: Literal["fault_reverted"] = "fault_reverted"
    id: int
    type: str = ""
    error: str | None = None


class RevertFailed(Event):
    event: Literal["revert_failed"] = "revert_failed"
    id: int
    type: str = ""
    error: str | None = None


class TargetExited(Event):
    """A process fault `id` acted on, or a service process it belongs to (`service_of`: the acted-on PID whose
    server it is, e.g. tritonserver for a python backend stub), seen gone (or a zombie: exited, not reaped yet),
    from the apply through the after phase; `when`: during the fault, at its revert, or after it."""

    event: Literal["target_exited"] = "target_exited"
    id: int
    step: str = ""
    type: str = ""
    pid: int
    comm: str = ""
    start_time: int = 0
    zombie: bool = False
    seen_at: float = 0.0  # wall clock when the run saw it gone
    when: Literal["during", "at_revert", "after"] = "during"
    service_of: int | None = None
    expected: bool = False  # the experiment declared target.may_exit: journaled, not a deviation

    @computed_field  # type: ignore[prop-decorator]
    @property
    def text(self) -> str:
        """`PID 29566 triton_python_backend_stub exited during the fault` (+ whose service, why it is listed)."""
        name = f" {self.comm}" if self.comm else ""
        whose = f" (the service of PID {self.service_of})" if self.service_of is not None else ""
        when = {"during": "during the fault", "at_revert": "when the fault was reverted",
                "after": "after the fault was reverted"}[self.when]
        return f"PID {self.pid}{name}{whose} exited {when}" + (
            " (a zombie: its parent has not reaped it)" if self.zombie else "")


class RolledBack(Event):
    event: Literal["rollback"] = "rollback"
    reverted: int
    failed: int
    ms: float
    ledger: str = ""


class LateApplyWait(Event):
    event: Literal["late_apply_wait"] = "late_apply_wait"
    ids: list[int]
    seconds: float


class LateApplyReverted(Event):
    event: Literal["late_apply_reverted"] = "late_apply_reverted"
    id: int
    type: str = ""
    error: str | None = None


class Recovered(Event):
    event: Literal["recovered"] = "recovered"
    seconds: float


class ServiceChecked(Event):
    """The after phase's check of the target service itself (a reference deployment: each replica's process is
    alive and answers the real 1-token request `chaoskit ref status` makes); `problems` empty when it passed."""

    event: Literal["service_checked"] = "service_checked"
    problems: list[str] = Field(default_factory=list)


class RunEnded(Event):
    event: Literal["end"] = "end"
    verdict: RunVerdict
    exit_code: int
    reason: str = ""
    deviations: list[str] = Field(default_factory=list)
    recovery_s: float | None = None


CATALOGUE: dict[str, type[Event]] = {
    cls.model_fields["event"].default: cls for cls in (
        ExperimentRecorded, HostFacts, RunStarted, StateChanged, Planned, Sample, Paused, WatchdogStarted,
        WatchdogDied, ErrorNoted, Interrupted, SafeguardTripped, OperatorChose, FaultApplied, FaultObserved,
        FaultReverted, RevertFailed, TargetExited, RolledBack, LateApplyWait, LateApplyReverted, Recovered, ServiceChecked,
        RunEnded)
}


def from_json(obj: dict[str, Any]) -> Event:
    """The typed event of one journal line; one the catalogue does not know, or cannot read, is an OtherEvent."""
    cls = CATALOGUE.get(str(obj.get("event")))
    if cls is not None:
        try:
            return cls.model_validate(obj)
        except ValidationError:
            pass
    rest = {k: v for k, v in obj.items() if k not in ("t", "event")}
    t = obj.get("t")
    return OtherEvent(t=float(t) if isinstance(t, (int, float)) else 0.0, event=str(obj.get("event")), data=rest)
