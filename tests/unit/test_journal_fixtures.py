"""Journals written by real runs (tests/fixtures/journals/*, made by the code of fbded2b, journal version 1: a
frozen HTTP server that deviates, and a safeguard that aborts with a fault in effect) render exactly the report,
Markdown summary, JUnit file and summary.json that run wrote, so a change to how events are typed or read cannot
change what a run reports. (That code wrote summary.json from its in-memory clocks; the journal holds the same
moments read a few microseconds later, so only those times may differ, by under a millisecond.) The two
report.html files were rewritten once, deliberately, by issue 43: the report draws the judgements the engine
recorded and never judges again, so a version 1 journal (which has none) has no `< 3x baseline = 21` line
(only the engine could say what its baseline was), and a chart is as wide as its longest threshold label (the
safeguard label `abort if stdout_number > 100` had been cut off at the edge)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any
from xml.etree import ElementTree as ET

import pytest

from chaoskit.engine.journal import read_journal
from chaoskit.model.events import OtherEvent, RunStarted
from chaoskit.report import html as report_html
from chaoskit.report import markdown as report_md
from chaoskit.report.outputs import junit_suite, summary
from chaoskit.report.view import run_view

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "journals"
RUNS = sorted(p.name for p in FIXTURES.iterdir() if p.is_dir())


def test_both_runs_are_there():
    assert RUNS == ["aborted", "deviated"]


@pytest.mark.parametrize("name", RUNS)
def test_html_report_is_the_one_the_run_wrote(name):
    d = FIXTURES / name
    view = run_view(read_journal(d / "journal.jsonl"))
    assert report_html.render(view) == (d / "report.html").read_text(encoding="utf-8")


@pytest.mark.parametrize("name", RUNS)
def test_markdown_summary_is_the_one_the_run_wrote(name):
    d = FIXTURES / name
    view = run_view(read_journal(d / "journal.jsonl"))
    assert report_md.render(view, "report.html") == (d / "summary.md").read_text(encoding="utf-8")


def test_fixture_verdicts():
    deviated = run_view(read_journal(FIXTURES / "deviated" / "journal.jsonl"))
    aborted = run_view(read_journal(FIXTURES / "aborted" / "journal.jsonl"))
    assert (deviated.verdict, deviated.exit_code, aborted.verdict, aborted.exit_code) == ("deviated", 1, "aborted", 3)
    assert ET.parse(FIXTURES / "aborted" / "junit.xml").getroot().get("failures") == "1"


TIMES = {"started", "ended", "t", "reverted_at"}  # the times fbded2b's summary took from its own clocks


def _same(want: Any, got: Any, key: str = "") -> None:
    if key in TIMES and isinstance(want, float):
        assert abs(want - got) < 1e-3, (key, want, got)
    elif isinstance(want, dict):
        assert list(want) == list(got), (key, list(want), list(got))
        for k in want:
            _same(want[k], got[k], k)
    elif isinstance(want, list):
        assert len(want) == len(got), key
        for a, b in zip(want, got, strict=True):
            _same(a, b, key)
    else:
        assert want == got, (key, want, got)


@pytest.mark.parametrize("name", RUNS)
def test_summary_json_is_the_one_the_run_wrote(name):
    d = FIXTURES / name
    got = json.loads(json.dumps(summary(run_view(read_journal(d / "journal.jsonl"))), default=str))
    _same(json.loads((d / "summary.json").read_text()), got)


@pytest.mark.parametrize("name", RUNS)
def test_junit_is_the_one_the_run_wrote(name):
    d = FIXTURES / name
    got = ET.tostring(junit_suite(run_view(read_journal(d / "journal.jsonl"))))
    assert got == ET.tostring(ET.parse(d / "junit.xml").getroot())


@pytest.mark.parametrize("name", RUNS)
def test_version_1_events_read_typed_and_write_back_the_same(name):
    lines = (FIXTURES / name / "journal.jsonl").read_text().splitlines()
    events = read_journal(FIXTURES / name / "journal.jsonl")
    assert not [e for e in events if isinstance(e, OtherEvent)]
    assert [e.journal for e in events if isinstance(e, RunStarted)] == [1]
    for line, ev in zip(lines, events, strict=True):
        want = json.loads(line)
        got = json.loads(json.dumps(ev.to_json(), default=str))
        assert got == (want | {"journal": 1} if want["event"] == "run" else want)
