"""A suite: experiments run one after another, each exactly as a single `chaoskit run` would, in its own
directory under the suite's; then one JUnit file (a testsuite per experiment), an index page linking each
report and a Markdown summary. The exit code is the worst of the experiments' codes by EXIT_ORDER; an
interrupted experiment stops the suite."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

from chaoskit import errors
from chaoskit.app.outputs import StepSummary, append_step_summary
from chaoskit.app.run import NotRun, Outcome, RunArgs
from chaoskit.errors import ChaoskitError, SpecError
from chaoskit.report import markdown
from chaoskit.report.outputs import junit_not_run, junit_suite, worst_exit, write_index, write_junit_suites
from chaoskit.report.view import SuiteRow

SUFFIXES = (".yaml", ".yml")


@dataclass(frozen=True)
class SuiteOutcome:
    paths: list[Path]
    outcomes: list[Outcome]
    rows: list[SuiteRow]  # one per experiment, run or not (exit_code None)
    code: int
    stopped: str  # why the suite stopped early ("" when every experiment ran)
    index: Path | None = None  # the files (not for a dry run)
    junit: Path | None = None
    summary_md: Path | None = None
    step_summary: StepSummary = StepSummary()


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
    return {name: value for name, value in cli_vars.items() if _takes(file, name, value)}


def _takes(file: Path, name: str, value: str) -> bool:
    """Whether `file` takes variable `name`: it loads with it, or it declares it (then the value is what its run
    refuses). A file that loads neither with nor without it is not given it: its run reports why it cannot
    load. Decided by loading, never by reading an error's text."""
    from chaoskit.experiment.loader import load_experiment

    try:
        load_experiment(file, {name: value}, strict=False)
        return True
    except ChaoskitError:
        pass
    try:
        return name in load_experiment(file, strict=False).variables
    except ChaoskitError:
        return False


def run_suite(files: list[Path], args: RunArgs, stop_on_failure: bool,
              run_one: Callable[[int, int, Path, RunArgs], Outcome]) -> SuiteOutcome:
    """Run each experiment with `run_one(i, n, file, args)`; SpecError when a --var belongs to none of them."""
    paths = expand(files)
    suite_dir = args.out_dir or Path("chaoskit-runs") / f"suite-{time.strftime('%Y%m%dT%H%M%S')}"
    known = {f: vars_for(f, args.cli_vars) for f in paths}
    for name in args.cli_vars:
        if not any(name in v for v in known.values()):
            raise SpecError(f"--var {name}: no experiment of the suite declares or uses it")
    outcomes, stopped = _run_all(paths, args, stop_on_failure, run_one, suite_dir, known)
    return _finish(paths, outcomes, stopped, suite_dir, args)


def _run_all(paths: list[Path], args: RunArgs, stop_on_failure: bool,
             run_one: Callable[[int, int, Path, RunArgs], Outcome], suite_dir: Path,
             known: dict[Path, dict[str, str]]) -> tuple[list[Outcome], str]:
    saved = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    got_term: list[int] = []

    def on_term(signum: int, _frame: object) -> None:  # between experiments nothing is applied: just stop
        got_term.append(signum)
        raise KeyboardInterrupt

    outcomes: list[Outcome] = []
    try:
        for i, f in enumerate(paths, 1):
            signal.signal(signal.SIGINT, signal.default_int_handler)  # an experiment may have left them ignored
            signal.signal(signal.SIGTERM, on_term)
            sub = replace(args, cli_vars=known[f], journal=None, junit=None, report=None,
                          out_dir=suite_dir / f"{i:02d}-{f.stem}", step_summary=False)
            try:
                rec = run_one(i, len(paths), f, sub)
            except KeyboardInterrupt:
                rec = Outcome(f, errors.EXIT_SIGTERM if got_term else errors.EXIT_SIGINT,
                              verdict=NotRun.INTERRUPTED, message="interrupted")
            outcomes.append(rec)
            if rec.code in (errors.EXIT_SIGINT, errors.EXIT_SIGTERM):
                return outcomes, "interrupted"
            if stop_on_failure and rec.code != 0:
                return outcomes, f"stopped after {f} (exit {rec.code}, --stop-on-failure)"
    finally:
        for sig, handler in saved.items():
            signal.signal(sig, handler)
    return outcomes, ""


def _row(rec: Outcome) -> SuiteRow:
    report = str(rec.files.report) if rec.files else None
    if rec.view is not None:
        return SuiteRow.of_run(rec.view, str(rec.file), rec.code, report)
    return SuiteRow(rec.experiment or rec.file.stem, str(rec.file), rec.verdict or f"exit {rec.code}", rec.code,
                    reason=(rec.message.splitlines() or [""])[0], report=report)


def _finish(paths: list[Path], outcomes: list[Outcome], stopped: str, suite_dir: Path, args: RunArgs) -> SuiteOutcome:
    code = worst_exit([o.code for o in outcomes])
    rows = [_row(o) for o in outcomes]
    rows += [SuiteRow(p.stem, str(p), "not run", None, reason=stopped) for p in paths[len(outcomes):]]
    if args.dry_run:
        return SuiteOutcome(paths, outcomes, rows, code, stopped)
    title = f"chaoskit suite ({len(outcomes)}/{len(paths)} run)"
    index = args.report or suite_dir / "index.html"
    write_index(index, title, rows)
    junit = args.junit or (suite_dir / "junit.xml" if args.ci else None)
    if junit:
        suites = [junit_suite(o.view) if o.view is not None else junit_not_run(
            o.experiment or o.file.stem, str(o.file), o.message or "did not run", o.code) for o in outcomes]
        suites += [junit_not_run(p.stem, str(p), stopped or "not run") for p in paths[len(outcomes):]]
        write_junit_suites(junit, suites)
    md_path = suite_dir / "summary.md"
    text = markdown.render_suite(title, rows, code, os.path.relpath(index, suite_dir))
    text += "".join("\n" + _from_suite(o, suite_dir) for o in outcomes if o.files)
    md_path.parent.mkdir(parents=True, exist_ok=True)
    md_path.write_text(text, encoding="utf-8")
    step = append_step_summary(text) if args.ci else StepSummary()
    return SuiteOutcome(paths, outcomes, rows, code, stopped, index, junit, md_path, step)


def _from_suite(o: Outcome, suite_dir: Path) -> str:
    """An experiment's Markdown with its report's path relative to the suite's summary (not its own run dir)."""
    assert o.files is not None
    own = os.path.relpath(o.files.report, o.files.report.parent)
    return o.files.markdown.replace(markdown.report_line(own),
                                    markdown.report_line(os.path.relpath(o.files.report, suite_dir)))
