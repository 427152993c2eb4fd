"""The words a run's records use: the phase a sample was taken in, a sample's verdict and a run's verdict."""

from __future__ import annotations

from enum import StrEnum


class Phase(StrEnum):
    """When a sample was taken: before/during/after are judged; the others are drawn, never judged."""

    BEFORE = "before"
    DURING = "during"
    AFTER = "after"
    GRACE = "grace"  # a fault is in effect, but the system may still be adapting to it
    BETWEEN = "between"  # no fault in effect during the method
    INTERIM = "interim"  # an `over: phase` probe's samples before the one that judges the whole span
    SAFEGUARD = "safeguard"  # taken for a safeguard only

    @property
    def judged(self) -> bool:
        return self in (Phase.BEFORE, Phase.DURING, Phase.AFTER)


class Verdict(StrEnum):
    """One sample's verdict."""

    OK = "ok"
    FAIL = "fail"
    ERROR = "error"


class RunVerdict(StrEnum):
    """What a run came to (the `end` event); UNFINISHED: its journal ends before the run did."""

    HELD = "held"
    DEVIATED = "deviated"
    PLANNED = "planned"
    ABORTED = "aborted"
    INTERRUPTED = "interrupted"
    FAILED = "failed"
    ROLLBACK_INCOMPLETE = "rollback_incomplete"
    UNFINISHED = "unfinished"
