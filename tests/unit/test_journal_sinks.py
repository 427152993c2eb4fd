"""Journal sinks: every journaled event (recorded facts too) reaches them after it is written; a failing sink
changes nothing."""

from __future__ import annotations

import json

from chaoskit.engine.journal import Journal, read_journal
from chaoskit.model.events import ErrorNoted, ExperimentRecorded, RunStarted


def test_sinks_get_recorded_and_emitted_events_after_they_are_written(tmp_path):
    path = tmp_path / "j.jsonl"
    jr = Journal(path)
    seen: list[tuple[str, int]] = []
    jr.sinks.append(lambda ev: seen.append((ev.event, len(path.read_text().splitlines()))))
    jr.record(ExperimentRecorded(name="e"))
    jr.emit(RunStarted(run_id="r", experiment="e"))
    jr.close()
    assert seen == [("experiment", 1), ("run", 2)]


def test_a_failing_sink_neither_raises_nor_stops_the_others_or_the_listeners(tmp_path):
    path = tmp_path / "j.jsonl"
    heard: list[str] = []
    jr = Journal(path, [lambda ev: heard.append("listener")])

    def broken(_ev: object) -> None:
        raise RuntimeError("exporter bug")

    jr.sinks += [broken, lambda ev: heard.append("sink")]
    jr.emit(ErrorNoted(where="x", error="y"))
    jr.close()
    assert heard == ["sink", "listener"]
    assert [e.event for e in read_journal(path)] == ["error"]
    assert json.loads(path.read_text())["where"] == "x"
