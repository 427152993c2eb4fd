"""The journal's event catalogue: every event written is read back as the same typed event; a line this
catalogue does not know survives as it was; the run event names the catalogue's version."""

from __future__ import annotations

import json

from chaoskit.engine.journal import Journal, read_journal
from chaoskit.model.enums import Phase, RunVerdict, Verdict
from chaoskit.model.events import (
    CATALOGUE,
    JOURNAL_VERSION,
    ErrorNoted,
    FaultApplied,
    OtherEvent,
    Planned,
    PlanStep,
    RunEnded,
    RunStarted,
    Sample,
    TargetExited,
    WatchdogStarted,
    from_json,
)

EVENTS = [
    RunStarted(t=1.0, run_id="r", experiment="e", journal=JOURNAL_VERSION),
    Planned(t=1.1, steps=[PlanStep(step="a", duration_s=2.0, changes=["x"], type="process.signal", path="method[0]"),
                          PlanStep(step="b", changes=["y"], variant="v", passed_over=["w: no"], type="v",
                                   path="method[1].parallel[0]")]),
    Sample(t=1.2, probe="p", phase=Phase.DURING, verdict=Verdict.FAIL, values={"v": 3}, details=["v: 3 < 2 is false"]),
    FaultApplied(t=1.3, id=1, step="a", type="process.signal", duration_s=2.0, applied_at=1.3, apply_ms=0.5),
    TargetExited(t=1.4, id=1, step="a", type="process.signal", pid=9, comm="sleep", start_time=4, zombie=True,
                 seen_at=1.4),
    WatchdogStarted(t=1.5, pid=7, ledger="/l", respawned=True),
    ErrorNoted(t=1.6, where="engine", error="E: x", traceback="tb"),
    RunEnded(t=2.0, verdict=RunVerdict.DEVIATED, exit_code=1, deviations=["p deviated"]),
]


def test_every_event_reads_back_as_itself(tmp_path):
    journal = Journal(tmp_path / "j.jsonl")
    for ev in EVENTS:
        journal.emit(ev)
    journal.close()
    assert read_journal(tmp_path / "j.jsonl") == EVENTS


def test_the_lines_are_the_documented_json():
    lines = [json.loads(json.dumps(ev.to_json())) for ev in EVENTS]
    assert lines[0] == {"t": 1.0, "event": "run", "run_id": "r", "experiment": "e", "dry_run": False,
                        "journal": JOURNAL_VERSION}
    assert lines[1]["steps"][0] == {"step": "a", "duration_s": 2.0, "changes": ["x"], "type": "process.signal",
                                    "path": "method[0]"}  # no variant: left out, as version 1 wrote it
    assert lines[2]["phase"] == "during" and lines[2]["verdict"] == "fail"
    assert "executor" not in lines[3] and lines[4]["text"].endswith("(a zombie: its parent has not reaped it)")
    assert list(lines[5]) == ["t", "event", "pid", "ledger", "respawned", "escaped_to", "problems"]
    assert EVENTS[6].shown() == "where=engine, error=E: x"  # the traceback is not shown


def test_unknown_and_unreadable_events_are_kept_as_written():
    newer = {"t": 3.0, "event": "from_the_future", "x": [1, 2]}
    broken = {"t": 4.0, "event": "sample", "probe": "p"}  # no phase, no verdict
    for line in (newer, broken):
        ev = from_json(line)
        assert isinstance(ev, OtherEvent) and ev.to_json() == line


def test_every_catalogued_event_has_its_own_name():
    assert len(CATALOGUE) == 24 and all(cls.model_fields["event"].default == name for name, cls in CATALOGUE.items())
