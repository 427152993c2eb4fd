"""`chaoskit run A.yaml B.yaml dir/`: a suite. The experiments run one after another, each exactly as a single
`chaoskit run` would, in its own directory under the suite's; then one table, one JUnit file (a testsuite per
experiment), an index page linking each report and a Markdown summary. The exit code is the worst of the
experiments' codes by `reports.EXIT_ORDER`; an interrupted experiment stops the suite."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from chaoskit import errors
from chaoskit.errors import ChaoskitError, SpecError

SUFFIXES = (".yaml", ".yml")


def expand(paths: list[Path]) -> list[Path]:
    """Files as given; a directory stands for its *.yaml / *.yml files (not recursive), sorted by name."""
    out: list[Path] = []
    for p in paths:
        if p.is_dir():
            found = sorted(f for f in p.iterdir() if f.is_file() and f.suffix in SUFFIXES)
            if not found:
                raise SpecError(f"{p}: no experiment files (*.yaml, *.yml) in this directory")
            out += found
        else:
            out.append(p)
    return out


def vars_for(file: Path, cli_vars: dict[str, str]) -> dict[str, str]:
    """The --var values this file declares or uses (a suite passes each file only its own)."""
    from chaoskit.experiment.loader import load_experiment

    known = {}
    for name, value in cli_vars.items():
        try:
            load_experiment(file, {name: value}, strict=False)
        except ChaoskitError as e:
            if str(e).startswith(f"--var {name}:"):
                continue  # not this file's variable
        known[name] = value  # any other problem is the run's to report
    return known


def _from_suite(o: Any, suite_dir: Path) -> str:
    """An experiment's Markdown with its report's path relative to the suite's summary (not its own run dir)."""
    from chaoskit.report import markdown

    if o.report is None:
        return o.markdown
    own = os.path.relpath(o.report, o.report.parent)
    return o.markdown.replace(markdown.report_line(own),
                              markdown.report_line(os.path.relpath(o.report, suite_dir)))


def run_suite(files: list[Path], args: Any, stop_on_failure: bool, run_one: Callable[..., int],
              out: Console) -> int:
    from chaoskit.cli import Outcome

    paths = expand(files)
    suite_dir = args.out_dir or Path("chaoskit-runs") / f"suite-{time.strftime('%Y%m%dT%H%M%S')}"
    known = {f: vars_for(f, args.cli_vars) for f in paths}
    for name in args.cli_vars:
        if not any(name in v for v in known.values()):
            raise SpecError(f"--var {name}: no experiment of the suite declares or uses it")
    saved = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    got_term: list[int] = []

    def on_term(signum: int, _frame: object) -> None:  # between experiments nothing is applied: just stop
        got_term.append(signum)
        raise KeyboardInterrupt

    outcomes: list[Any] = []
    stopped = ""
    try:
        for i, f in enumerate(paths, 1):
            signal.signal(signal.SIGINT, signal.default_int_handler)  # an experiment may have left them ignored
            signal.signal(signal.SIGTERM, on_term)
            out.print(f"[bold]suite {i}/{len(paths)}:[/] {escape(str(f))}", highlight=False, soft_wrap=True)
            rec = Outcome(f)
            sub = replace(args, cli_vars=known[f], journal=None, junit=None, report=None,
                          out_dir=suite_dir / f"{i:02d}-{f.stem}", step_summary=False)
            try:
                rec.code = run_one(f, sub, rec)
            except typer.Exit as e:
                rec.code = e.exit_code
            except KeyboardInterrupt:
                rec.code = errors.EXIT_SIGTERM if got_term else errors.EXIT_SIGINT
                rec.message, rec.verdict = rec.message or "interrupted", "interrupted"
            outcomes.append(rec)
            if rec.code in (errors.EXIT_SIGINT, errors.EXIT_SIGTERM):
                stopped = "interrupted"
                break
            if stop_on_failure and rec.code != 0:
                stopped = f"stopped after {f} (exit {rec.code}, --stop-on-failure)"
                break
    finally:
        for sig, handler in saved.items():
            signal.signal(sig, handler)
    return _finish(paths, outcomes, stopped, suite_dir, args, out)


def _row(rec: Any) -> Any:
    from chaoskit.report.view import SuiteRow

    report = str(rec.report) if rec.report else None
    if rec.view is not None:
        return SuiteRow.of_run(rec.view, str(rec.file), rec.code, report)
    return SuiteRow(rec.experiment or rec.file.stem, str(rec.file), rec.verdict or f"exit {rec.code}", rec.code,
                    reason=(rec.message.splitlines() or [""])[0], report=report)


def _finish(paths: list[Path], outcomes: list[Any], stopped: str, suite_dir: Path, args: Any, out: Console) -> int:
    from chaoskit.cli import append_step_summary
    from chaoskit.report import markdown
    from chaoskit.report.outputs import (
        EXIT_ORDER,
        junit_not_run,
        junit_suite,
        worst_exit,
        write_index,
        write_junit_suites,
    )
    from chaoskit.report.view import SuiteRow

    code = worst_exit([o.code for o in outcomes])
    rows = [_row(o) for o in outcomes]
    skipped = [SuiteRow(p.stem, str(p), "not run", None, reason=stopped) for p in paths[len(outcomes):]]
    table = Table(title=f"suite: {len(outcomes)} of {len(paths)} experiments run", title_justify="left")
    for col in ("#", "experiment", "verdict", "exit", "duration", "why"):
        table.add_column(col)
    for i, r in enumerate(rows + skipped, 1):
        style = {0: "green", 1: "yellow", None: "dim"}.get(r.exit_code, "red")
        table.add_row(str(i), r.experiment, f"[{style}]{escape(r.verdict)}[/]",
                      "-" if r.exit_code is None else str(r.exit_code),
                      f"{r.duration_s:.1f}s" if r.exit_code is not None else "", escape(r.why()[:200]))
    out.print(table)
    order = " > ".join(str(c) for c in EXIT_ORDER)
    out.print(f"suite exit {code} (the worst of the experiments' codes; order {order})"
              + (f"; {stopped}" if stopped else ""), highlight=False, soft_wrap=True)
    if args.dry_run:
        return code
    title = f"chaoskit suite ({len(outcomes)}/{len(paths)} run)"
    index = args.report or suite_dir / "index.html"
    write_index(index, title, rows + skipped)
    junit = args.junit or (suite_dir / "junit.xml" if args.ci else None)
    if junit:
        suites = [junit_suite(o.view) if o.view is not None else junit_not_run(o.experiment or o.file.stem, str(o.file),
                                                                  o.message or "did not run", o.code)
                  for o in outcomes]
        suites += [junit_not_run(p.stem, str(p), stopped or "not run") for p in paths[len(outcomes):]]
        write_junit_suites(junit, suites)
    md_path = suite_dir / "summary.md"
    text = markdown.render_suite(title, rows + skipped, code, os.path.relpath(index, suite_dir))
    text += "".join("\n" + _from_suite(o, suite_dir) for o in outcomes if o.markdown)
    md_path.parent.mkdir(parents=True, exist_ok=True)
    md_path.write_text(text, encoding="utf-8")
    added = append_step_summary(text) if args.ci else ""
    out.print(f"  index {index}" + (f"  junit {junit}" if junit else "") + f"  summary {md_path}{added}",
              highlight=False, soft_wrap=True)
    return code
