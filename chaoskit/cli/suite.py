"""`chaoskit run A.yaml B.yaml dir/`: a suite (app.suite runs it), shown as it runs and as one table at the
end, with where its index, JUnit file and Markdown summary are."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from rich.markup import escape

from chaoskit.term import Table, console

if TYPE_CHECKING:
    from chaoskit.app.outputs import StepSummary
    from chaoskit.app.run import Outcome, RunArgs
    from chaoskit.app.suite import SuiteOutcome

out = console()
err = console(stderr=True)
VERDICT_STYLE = {"held": "green", "deviated": "yellow", "not run": "dim"}  # any other verdict: red


def step_summary_note(step: StepSummary) -> str:
    """What an output line adds for $GITHUB_STEP_SUMMARY (and a note on stderr when it could not be written)."""
    if step.error is not None:
        err.print(f"[yellow]note:[/] could not append to $GITHUB_STEP_SUMMARY ({step.target}): {escape(step.error)}",
                  highlight=False)
    return " (+ $GITHUB_STEP_SUMMARY)" if step.appended else ""


def run_suite(files: list[Path], args: RunArgs, stop_on_failure: bool,
              run_one: Callable[[Path, RunArgs], Outcome]) -> int:
    """The suite's exit code; SpecError (app.suite) when a --var belongs to none of its experiments."""
    from chaoskit.app import suite

    def each(i: int, n: int, file: Path, sub: RunArgs) -> Outcome:
        out.print(f"[bold]suite {i}/{n}:[/] {escape(str(file))}", highlight=False, soft_wrap=True)
        return run_one(file, sub)

    result = suite.run_suite(files, args, stop_on_failure, each)
    _table(result)
    if result.summary_md is not None:
        out.print(f"  index {result.index}" + (f"  junit {result.junit}" if result.junit else "")
                  + f"  summary {result.summary_md}{step_summary_note(result.step_summary)}",
                  highlight=False, soft_wrap=True)
    return result.code


def _table(result: SuiteOutcome) -> None:
    from chaoskit.report.outputs import EXIT_ORDER

    table = Table(title=f"suite: {len(result.outcomes)} of {len(result.paths)} experiments run", title_justify="left")
    for col in ("#", "experiment", "verdict", "exit", "duration", "why"):
        table.add_column(col)
    for i, r in enumerate(result.rows, 1):
        style = VERDICT_STYLE.get(r.verdict, "red")
        table.add_row(str(i), r.experiment, f"[{style}]{escape(r.verdict)}[/]",
                      "-" if r.exit_code is None else str(r.exit_code),
                      f"{r.duration_s:.1f}s" if r.exit_code is not None else "", escape(r.why()[:200]))
    out.print(table)
    order = " > ".join(str(c) for c in EXIT_ORDER)
    out.print(f"suite exit {result.code} (the worst of the experiments' codes; order {order})"
              + (f"; {result.stopped}" if result.stopped else ""), highlight=False, soft_wrap=True)
