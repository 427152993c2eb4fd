"""What a finished run leaves behind, each rendered from its one RunView: summary.json, report.html, JUnit XML,
the Markdown summary (and with --ci on GitHub Actions, the job's step summary)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from chaoskit.engine.journal import read_journal
from chaoskit.report import markdown
from chaoskit.report.outputs import summary, write_html, write_junit, write_summary
from chaoskit.report.view import RunView, run_view


@dataclass(frozen=True)
class StepSummary:
    """$GITHUB_STEP_SUMMARY: whether the Markdown went there, or why not (None, None: it is not set)."""

    appended: bool = False
    error: str | None = None
    target: str | None = None


@dataclass(frozen=True)
class RunFiles:
    journal: Path
    report: Path
    junit: Path | None
    summary_md: Path | None  # --ci only
    markdown: str  # the Markdown summary (a suite puts it under its own)
    step_summary: StepSummary


def write_outputs(journal: Path, args: Any, run_dir: Path) -> tuple[RunView, RunFiles]:
    """The run's view (from its journal alone: `chaoskit report` remakes the same report) and its files."""
    view = run_view(read_journal(journal))
    write_summary(journal.with_name("summary.json"), summary(view))
    report = args.report or run_dir / "report.html"
    write_html(report, view)
    junit = args.junit or (run_dir / "junit.xml" if args.ci else None)
    if junit:
        write_junit(junit, view)
    md_path = journal.with_name("summary.md")
    text = markdown.render(view, os.path.relpath(report, md_path.parent))
    if args.ci:
        md_path.write_text(text, encoding="utf-8")
    step = append_step_summary(text) if args.ci and args.step_summary else StepSummary()
    return view, RunFiles(journal, report, junit, md_path if args.ci else None, text, step)


def append_step_summary(text: str) -> StepSummary:
    """--ci on GitHub Actions: the Markdown summary goes onto the job's page too."""
    target = os.environ.get("GITHUB_STEP_SUMMARY")
    if not target:
        return StepSummary()
    try:
        with open(target, "a", encoding="utf-8") as fh:
            fh.write(text + "\n")
    except OSError as e:
        return StepSummary(False, str(e), target)
    return StepSummary(True, None, target)
