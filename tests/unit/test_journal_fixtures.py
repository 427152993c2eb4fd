"""Journals written by real runs (tests/fixtures/journals/*, made by the code of fbded2b: a frozen HTTP server
that deviates, and a safeguard that aborts with a fault in effect) render exactly the report, Markdown summary
and JUnit file that run wrote, so a change to how events are typed or read cannot change what a run reports."""

from __future__ import annotations

from pathlib import Path
from xml.etree import ElementTree as ET

import pytest

from chaoskit.engine import report_html, report_md
from chaoskit.engine.journal import read_journal
from chaoskit.engine.report_data import run_view

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
