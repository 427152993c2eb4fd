"""The run state machine: the only place a run's status is set, and where the exit code comes from."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum

from chaoskit import errors
from chaoskit.model.enums import RunVerdict


class State(str, Enum):
    PENDING = "pending"
    VALIDATING = "validating"
    PREFLIGHT = "preflight"
    HYPOTHESIS_BEFORE = "hypothesis_before"
    METHOD = "method"
    ROLLBACK = "rollback"
    HYPOTHESIS_AFTER = "hypothesis_after"
    DONE = "done"
    ABORTED = "aborted"
    INTERRUPTED = "interrupted"
    FAILED = "failed"


TERMINAL = {State.DONE, State.ABORTED, State.INTERRUPTED, State.FAILED}
S = State
TRANSITIONS: dict[State, set[State]] = {
    S.PENDING: {S.VALIDATING, S.INTERRUPTED, S.FAILED},
    S.VALIDATING: {S.PREFLIGHT, S.FAILED, S.INTERRUPTED},
    S.PREFLIGHT: {S.HYPOTHESIS_BEFORE, S.DONE, S.FAILED, S.INTERRUPTED},  # DONE: --dry-run
    S.HYPOTHESIS_BEFORE: {S.METHOD, S.ROLLBACK},  # ROLLBACK: did not hold / interrupted (nothing applied)
    S.METHOD: {S.ROLLBACK},
    S.ROLLBACK: {S.HYPOTHESIS_AFTER, S.DONE, S.ABORTED, S.INTERRUPTED, S.FAILED},
    S.HYPOTHESIS_AFTER: {S.DONE, S.ABORTED, S.INTERRUPTED, S.FAILED},  # ABORTED: halted (nothing left applied)
}


class FailureKind(str, Enum):
    INVALID = "invalid"
    PREFLIGHT = "preflight"
    APPLY = "apply"
    INTERNAL = "internal"


class Event(str, Enum):
    """What the runner reports; `RunStatus.on` alone decides the next state from it and the flags."""

    BEGIN = "begin"
    VALIDATED = "validated"
    PREFLIGHT_FAILED = "preflight_failed"
    PREFLIGHT_OK = "preflight_ok"
    BEFORE_CHECKED = "before_checked"  # held or not: `deviated` says
    WATCHDOG_FAILED = "watchdog_failed"
    METHOD_DONE = "method_done"  # normally, aborted by a safeguard, interrupted, or an apply failed: flags say
    ROLLBACK_DONE = "rollback_done"
    AFTER_DONE = "after_done"
    ENGINE_ERROR = "engine_error"


INTERRUPTED_AFTER = "interrupted; everything applied was reverted"


@dataclass
class RunStatus:
    """Current state, how it got there, and the flags that decide the exit code."""

    state: State = State.PENDING
    deviated: bool = False
    deviations: list[str] = field(default_factory=list)
    failure: FailureKind | None = None
    reason: str = ""
    signal: int | None = None
    rollback_incomplete: bool = False
    dry_run: bool = False
    aborted: str = ""  # the safeguard's reason, once one tripped
    halted: str = ""  # `halted: WHY`, once a halt lever (chaoskit halt) was seen: stop, roll back, exit 3
    method_ran: bool = False  # faults may have been applied (the after-check and its recovery time apply)
    history: list[tuple[str, float]] = field(default_factory=lambda: [(State.PENDING.value, time.time())])
    on_change: Callable[[State, State, str], None] | None = None

    def to(self, new: State, reason: str = "") -> None:
        if new not in TRANSITIONS.get(self.state, set()):
            raise RuntimeError(f"illegal transition {self.state.value} -> {new.value}")
        old, self.state = self.state, new
        self.history.append((new.value, time.time()))
        if reason:
            self.reason = reason
        if self.on_change:
            self.on_change(old, new, reason)

    def on(self, event: Event, reason: str = "") -> State:
        """The one place the next state is decided: from the current state, the event and the flags."""
        new, why = self._decide(event, reason)
        if new is not self.state:  # an engine error during the rollback stays there: the rollback finishes
            self.to(new, why)
        return new

    def _decide(self, event: Event, reason: str) -> tuple[State, str]:
        s, stopped = self.state, self.stopped
        if event is Event.ENGINE_ERROR:
            self.fail(FailureKind.INTERNAL, reason)
            return (S.ROLLBACK, reason) if s in (S.HYPOTHESIS_BEFORE, S.METHOD, S.ROLLBACK) else (S.FAILED, reason)
        if event is Event.PREFLIGHT_FAILED:
            self.fail(FailureKind.PREFLIGHT, reason)
            return S.FAILED, reason
        if event is Event.WATCHDOG_FAILED:
            self.fail(FailureKind.APPLY, reason)
            return S.ROLLBACK, reason
        if event is Event.PREFLIGHT_OK:
            if self.dry_run:
                return S.DONE, "dry run: nothing applied"
            if self.halted:  # nothing applied yet: refused like a run started while halted (exit 4)
                self.fail(FailureKind.PREFLIGHT, self.halted)
                return S.FAILED, self.halted
            return (S.INTERRUPTED, "interrupted before anything was applied") if stopped else (S.HYPOTHESIS_BEFORE, "")
        if event is Event.BEFORE_CHECKED:
            if stopped or self.deviated:
                return S.ROLLBACK, reason
            self.method_ran = True
            return S.METHOD, reason
        if event is Event.ROLLBACK_DONE:
            return self._after_rollback()
        if event is Event.AFTER_DONE:
            if self.halted:
                return S.ABORTED, self.halted
            return (S.INTERRUPTED, INTERRUPTED_AFTER) if stopped else (S.DONE, "")
        simple = {Event.BEGIN: S.VALIDATING, Event.VALIDATED: S.PREFLIGHT, Event.METHOD_DONE: S.ROLLBACK}
        return simple[event], reason

    def _after_rollback(self) -> tuple[State, str]:
        if self.aborted:
            return S.ABORTED, self.aborted
        if self.failure is not None:
            return S.FAILED, self.reason
        if self.halted:
            return S.ABORTED, self.halted
        if self.signal is not None:
            return S.INTERRUPTED, INTERRUPTED_AFTER
        return (S.HYPOTHESIS_AFTER, "") if self.method_ran else (S.DONE, "")

    def deviate(self, why: str) -> None:
        self.deviated = True
        if why not in self.deviations:
            self.deviations.append(why)

    def fail(self, kind: FailureKind, reason: str) -> None:
        """Record why the run failed; the caller moves to FAILED (directly or after rollback)."""
        self.failure = kind
        self.reason = reason

    def interrupt(self, signum: int) -> None:
        if self.signal is None:
            self.signal = signum

    def halt(self, reason: str) -> bool:
        """A halt lever was seen (`reason`: `halted: WHY`); the caller stops the method. False if already halted."""
        if self.halted:
            return False
        self.halted = reason
        return True

    @property
    def stopped(self) -> bool:
        """Interrupted by a signal or halted: no further phase starts; the rollback still runs in full."""
        return self.signal is not None or bool(self.halted)

    @property
    def terminal(self) -> bool:
        return self.state in TERMINAL

    @property
    def verdict(self) -> RunVerdict:
        if self.rollback_incomplete:
            return RunVerdict.ROLLBACK_INCOMPLETE
        if self.state is State.DONE and self.dry_run:
            return RunVerdict.PLANNED
        if self.state is State.DONE:
            return RunVerdict.DEVIATED if self.deviated else RunVerdict.HELD
        return RunVerdict(self.state.value) if self.terminal else RunVerdict.UNFINISHED

    def exit_code(self) -> int:
        if self.rollback_incomplete:
            return errors.EXIT_ROLLBACK_INCOMPLETE
        if self.state is State.INTERRUPTED:
            return errors.EXIT_SIGTERM if self.signal == 15 else errors.EXIT_SIGINT
        if self.state is State.ABORTED:
            return errors.EXIT_ABORTED
        if self.state is State.FAILED:
            return {FailureKind.INVALID: errors.EXIT_INVALID,
                    FailureKind.PREFLIGHT: errors.EXIT_PREFLIGHT}.get(self.failure, errors.EXIT_DEVIATED)  # type: ignore
        if self.state is State.DONE:
            return errors.EXIT_DEVIATED if self.deviated else errors.EXIT_HELD
        raise RuntimeError(f"run is not finished (state {self.state.value})")
