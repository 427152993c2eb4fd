"""`chaoskit report JOURNAL`: rebuild a run's HTML report from its journal alone (the same file the run wrote),
or write its Markdown summary for a CI job page or a pull-request comment."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import typer
from rich.markup import escape

from chaoskit.errors import ChaoskitError
from chaoskit.term import console

out = console()
err = console(stderr=True)


def fail(e: ChaoskitError) -> None:
    err.print(f"[red]error:[/] {escape(str(e))}", highlight=False, soft_wrap=True)
    raise typer.Exit(e.exit_code)


def report(
    journal: Path = typer.Argument(..., help="a run's journal (journal.jsonl)"),
    output: Path | None = typer.Option(None, "-o", "--output", help="where to write; - for stdout (default: "
                                       "report.html or summary.md beside the journal)"),
    fmt: str = typer.Option("html", "--format", help="html (the full report) or md (a summary for a CI job page "
                            "or a pull-request comment)"),
) -> None:
    """Rebuild a run's report from its journal alone (the same report the run wrote), or a Markdown summary."""
    from chaoskit.engine.journal import read_journal
    from chaoskit.model.events import RunStarted
    from chaoskit.report import html, markdown
    from chaoskit.report.view import run_view

    if fmt not in ("html", "md"):
        fail(ChaoskitError(f"--format {fmt}: expected html or md"))
    if not journal.is_file():
        fail(ChaoskitError(f"{journal}: no such journal file"))
    try:
        events = read_journal(journal)
    except (OSError, UnicodeDecodeError) as e:
        fail(ChaoskitError(f"{journal}: cannot read: {e}"))
    if not any(isinstance(ev, RunStarted) for ev in events):
        fail(ChaoskitError(f"{journal}: not a chaoskit journal (no 'run' event)"))
    html_path = journal.with_name("report.html")
    view = run_view(events)
    to_stdout = output is not None and str(output) == "-"
    target = journal.with_name("report.html" if fmt == "html" else "summary.md") if output is None or to_stdout \
        else output
    text = (html.render(view) if fmt == "html"  # the summary names the report relative to itself
            else markdown.render(view, os.path.relpath(html_path, target.parent) if html_path.exists() else None))
    if to_stdout:
        sys.stdout.write(text)
        return
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(text, encoding="utf-8")
    out.print(f"{'report' if fmt == 'html' else 'summary'} {target}", highlight=False)
