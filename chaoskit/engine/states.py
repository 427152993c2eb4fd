"""The run state machine: the only place a run's status is set, and where the exit code comes from."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum

from chaoskit import errors


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
    S.HYPOTHESIS_AFTER: {S.DONE, S.INTERRUPTED},
}


class FailureKind(str, Enum):
    INVALID = "invalid"
    PREFLIGHT = "preflight"
    APPLY = "apply"
    INTERNAL = "internal"


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

    @property
    def terminal(self) -> bool:
        return self.state in TERMINAL

    @property
    def verdict(self) -> str:
        if self.rollback_incomplete:
            return "rollback_incomplete"
        if self.state is State.DONE and self.dry_run:
            return "planned"
        if self.state is State.DONE:
            return "deviated" if self.deviated else "held"
        return self.state.value

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
