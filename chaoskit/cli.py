"""The `chaoskit` command line: parse, call the engine, render. Errors become one clear message + exit code."""

from __future__ import annotations

import asyncio
import faulthandler
import json
import os
import signal
import sys
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import typer
from rich.markup import escape
from rich.table import Table

from chaoskit import __version__, errors
from chaoskit.errors import ChaoskitError
from chaoskit.term import console

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_show_locals=False,
                  help="Chaos engineering and fault injection for LLM inference services.")
out = console()
err = console(stderr=True)


def _add_subcommands() -> None:
    from chaoskit.cli_init import init
    from chaoskit.cli_load import load
    from chaoskit.cli_ref import ref_app
    from chaoskit.cli_report import report

    app.add_typer(ref_app, name="ref")
    app.command()(init)
    app.command()(load)
    app.command()(report)


_add_subcommands()


def _fail(e: ChaoskitError) -> None:
    for line in str(e).splitlines():
        err.print(f"[red]error:[/] {escape(line)}", markup=True, highlight=False, soft_wrap=True)
    raise typer.Exit(e.exit_code)


def _say(message: str) -> None:
    err.print(message, highlight=False)


_MAIN_PID = os.getpid()


def _term_as_interrupt(signum: int, _frame: object) -> None:
    """SIGTERM while the deployment starts: unwind like Ctrl-C, so what started is stopped. Only here: a child
    forked by a library (pyroute2's netns helper) that inherits this handler just dies of the signal."""
    if os.getpid() != _MAIN_PID:
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)
        return
    raise KeyboardInterrupt


def _host_preflight(loaded: Any) -> None:
    """Before starting a deployment: the faults that do not need its facts must be possible on this host
    (a GPU-only scenario on a CPU host is refused at once, not after the replicas are up)."""
    from chaoskit.engine.plan import deferred_paths, plan_faults
    from chaoskit.errors import PreflightError

    _, _, problems = plan_faults(loaded.experiment.method, deferred_paths(loaded.deferred))
    if problems:
        raise PreflightError("\n".join(problems) + "\n(the reference deployment was not started)")


def _replay_orphans() -> None:
    """Before any command that starts work: finish ledgers left by runs that died together with their watchdog."""
    from chaoskit.engine.rollback import replay_orphans

    for st, result in replay_orphans():
        err.print(f"[yellow]note:[/] run {st.run_id} died together with its watchdog; replayed its ledger:",
                  highlight=False)
        for e in result.reverted:
            err.print(f"  [green]reverted[/] #{e.id} {e.type} ({st.run_id})", highlight=False)
        for e, why in result.failed:
            err.print(f"  [bold red]FAILED[/] #{e.id} {e.type} ({st.run_id}): {escape(why)} - run `chaoskit rollback --all`",
                      highlight=False)


@dataclass
class RunArgs:
    """What `chaoskit run` was told, shared by every experiment of a suite."""

    dry_run: bool = False
    cli_vars: dict[str, str] = field(default_factory=dict)
    journal: Path | None = None
    junit: Path | None = None
    report: Path | None = None
    out_dir: Path | None = None
    live: bool | None = None
    step: bool = False
    ci: bool = False
    step_summary: bool = True  # --ci: append the Markdown summary to $GITHUB_STEP_SUMMARY (a suite does it once)


@dataclass
class Outcome:
    """What one experiment of a run came to (the suite's table, JUnit file and index are made of these)."""

    file: Path
    code: int = errors.EXIT_INVALID
    experiment: str = ""
    view: Any = None  # the run's RunView, when the run got that far
    report: Path | None = None
    markdown: str = ""
    message: str = ""
    verdict: str = ""  # why it came to no view: invalid, preflight failed, interrupted (or the dry run's verdict)


@app.command()
def run(
    files: list[Path] = typer.Argument(..., help="experiment YAML, or a bundled experiment's name (chaoskit list); "
                                      "several files or a directory make a suite"),
    dry_run: bool = typer.Option(False, "--dry-run", help="validate, check the host, print the plan; apply nothing"),
    var: list[str] = typer.Option([], "--var", help="NAME=VALUE for {NAME} substitution (repeatable)"),
    journal: Path | None = typer.Option(None, help="JSON-lines journal (default: OUT/journal.jsonl)"),
    junit: Path | None = typer.Option(None, help="write JUnit XML here (a suite: one testsuite per experiment)"),
    report: Path | None = typer.Option(None, help="HTML report (default: OUT/report.html; a suite: its index)"),
    out_dir: Path | None = typer.Option(None, "--out", help="run directory (default: chaoskit-runs/RUN_ID)"),
    live: bool | None = typer.Option(None, "--live/--plain", help="live view (default: when stdout is a TTY)"),
    step: bool = typer.Option(False, "--step", help="game day: before each method step show its plan and ask: "
                              "continue, skip it, or abort (roll back everything)"),
    ci: bool = typer.Option(False, "--ci", help="CI gate: plain output, JUnit (default OUT/junit.xml) and a Markdown "
                            "summary (OUT/summary.md, appended to $GITHUB_STEP_SUMMARY when that is set)"),
    stop_on_failure: bool = typer.Option(False, "--stop-on-failure", help="suite: stop after the first experiment "
                                         "that does not exit 0"),
) -> None:
    """Run an experiment: hypothesis before, faults, hypothesis during and after; always roll back. Several
    files (or a directory of them) run as a suite, in order, with one summary, JUnit file and index page."""
    from chaoskit.paths import experiment_path

    files = [experiment_path(f) for f in files]  # a path as given wins; else a bundled experiment's name
    suite = len(files) > 1 or files[0].is_dir()
    try:  # the argument checks that need nothing loaded come first (loading the spec takes a while)
        if step and (dry_run or ci):
            raise ChaoskitError("--step asks an operator before each step; it does not go with --dry-run or --ci")
        if step and not sys.stdin.isatty():
            raise ChaoskitError("--step asks before each step: stdin must be a terminal")
        if suite and journal is not None:
            raise ChaoskitError("--journal names one experiment's journal; a suite writes one per experiment "
                                "under --out")
        from chaoskit.experiment.loader import parse_cli_vars

        cli_vars = parse_cli_vars(var)
    except ChaoskitError as e:
        _fail(e)
    args = RunArgs(dry_run, cli_vars, journal, junit, report, out_dir, live, step, ci)
    if not suite:
        raise typer.Exit(run_one(files[0], args, Outcome(files[0])))
    from chaoskit.cli_suite import run_suite

    try:
        code = run_suite(files, args, stop_on_failure, run_one, out)
    except ChaoskitError as e:
        _fail(e)
    raise typer.Exit(code)


def run_one(file: Path, args: RunArgs, rec: Outcome) -> int:
    """One experiment, start to end: the exit code (typer.Exit for input errors, after saying why)."""
    from chaoskit.engine.runner import new_run_id
    from chaoskit.experiment.loader import load_experiment
    from chaoskit.experiment.models import Reference

    try:
        loaded = load_experiment(file, args.cli_vars, strict=not args.dry_run)
    except ChaoskitError as e:
        _fail_rec(rec, e)
    if not args.dry_run:
        _replay_orphans()
    exp = loaded.experiment
    rec.experiment = exp.metadata.name
    own = exp.target.reference.effective(loaded.variables) if isinstance(exp.target.reference, Reference) else None
    run_id = new_run_id(exp.metadata.name)
    run_dir = args.out_dir or Path("chaoskit-runs") / run_id
    journal_path = args.journal or run_dir / "journal.jsonl"
    with ExitStack() as deployed:
        if own is not None:
            loaded = _deploy(deployed, own, loaded, file, args, run_id, rec)
        result, exp = _execute(loaded, args, journal_path, run_id)
        if own is not None and not args.dry_run:
            for sig in (signal.SIGINT, signal.SIGTERM):  # the deployment is stopping: let it finish (≤ 15 s)
                signal.signal(sig, signal.SIG_IGN)
    rec.code = result.exit_code
    if args.dry_run:
        return _print_plan(exp, result, rec)
    return _report(exp, result, args, run_dir, journal_path, rec)


def _fail_rec(rec: Outcome, e: ChaoskitError) -> None:
    from chaoskit.errors import PreflightError

    rec.code, rec.message = e.exit_code, str(e)
    rec.verdict = "preflight failed" if isinstance(e, PreflightError) else "invalid"
    _fail(e)


def _deploy(deployed: ExitStack, own: Any, loaded: Any, file: Path, args: RunArgs, run_id: str,
            rec: Outcome) -> Any:
    """Bring up (or reuse) the deployment the experiment declares, inside `deployed`; the experiment loaded
    again with its facts. A dry run starts nothing."""
    from chaoskit.experiment.loader import load_experiment
    from chaoskit.reference.scenario import deployment_for, describe, running_facts

    if args.dry_run:
        facts = running_facts(own)
        if facts is None:
            err.print(f"[yellow]note:[/] would start the reference deployment: {describe(own)}", highlight=False)
            return loaded
        err.print(f"[yellow]note:[/] would reuse the running reference deployment at {facts['url']}: "
                  f"{describe(own)}", highlight=False)
        try:
            return load_experiment(file, args.cli_vars, strict=False, deployed=facts)
        except ChaoskitError as e:
            _fail_rec(rec, e)
    signal.signal(signal.SIGTERM, _term_as_interrupt)  # a stop while it starts: stop what started
    try:
        _host_preflight(loaded)
        facts = deployed.enter_context(deployment_for(own, run_id, loaded.experiment.metadata.name, _say))
        return load_experiment(file, args.cli_vars, deployed=facts)
    except KeyboardInterrupt:
        deployed.close()
        err.print("[red]interrupted[/] while the reference deployment was starting (stopped again)")
        rec.code, rec.message = errors.EXIT_SIGINT, "interrupted while the reference deployment was starting"
        rec.verdict = "interrupted"
        raise typer.Exit(errors.EXIT_SIGINT) from None
    except ChaoskitError as e:
        deployed.close()
        _fail_rec(rec, e)
        raise  # unreachable: _fail raises


def _make_view(record: Any, use_live: bool) -> Any:
    """The live view (what each probe's tolerances judge, the safeguards: from the experiment's record) or the
    plain one."""
    from chaoskit.ui import LiveView, PlainView

    if not use_live:
        return PlainView(out)
    return LiveView(out, record.name, {probe: list(keys) for probe, keys in record.expect.items()},
                    record.safeguards)


def _execute(loaded: Any, args: RunArgs, journal_path: Path, run_id: str) -> tuple[Any, Any]:
    """Journal, view, runner: run the experiment; (its result, the experiment). A dry run plans the steps whose
    target needs facts not known yet as "at run time", never with a stand-in that could select more."""
    from chaoskit.engine.journal import Journal
    from chaoskit.engine.plan import deferred_paths
    from chaoskit.engine.runinfo import experiment_record, host_facts
    from chaoskit.engine.runner import Runner, RunOptions

    exp = loaded.experiment
    for note in loaded.notes:
        err.print(f"[yellow]note:[/] {escape(note)}", highlight=False)
    for warning in loaded.warnings:
        err.print(f"[bold yellow]warning:[/] {escape(warning)}", highlight=False)
    use_live = (out.is_terminal and not args.ci) if args.live is None else args.live
    record = experiment_record(loaded)
    view = _make_view(record, use_live)
    jr = Journal(None if args.dry_run else journal_path, [view])
    if not args.dry_run:  # what the report needs besides the events: the experiment as run, the host
        jr.record(record)
        jr.record(host_facts())
    unresolved = deferred_paths(loaded.deferred) if args.dry_run else frozenset()
    stepper = None
    if args.step:
        from chaoskit.stepper import Stepper

        stepper = Stepper(out, jr, view)
    runner = Runner(exp, jr, RunOptions(dry_run=args.dry_run, unresolved_steps=unresolved, before_step=stepper),
                    run_id=run_id)
    faulthandler.register(signal.SIGUSR1, all_threads=True)  # kill -USR1 PID: every thread's stack on stderr

    async def main() -> None:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, runner.interrupt, sig)
        await runner.execute()

    if use_live:
        with view:
            asyncio.run(main())
    else:
        asyncio.run(main())
    jr.close()
    return runner.result, exp


def _print_plan(exp: Any, result: Any, rec: Outcome) -> int:
    out.print(f"[bold]plan for {exp.metadata.name}[/] (dry run: nothing applied)")
    for p in result.plan:
        dur = f" for {p.duration_s:g}s" if p.duration_s else " until the end of the method"
        out.print(f"  • {p.step} ({p.type}{dur})")
        for change in p.changes:
            out.print(f"      {change}", highlight=False, markup=False)
    from chaoskit.engine.states import FailureKind

    preflight_failed = result.status.failure is FailureKind.PREFLIGHT
    rec.verdict = "preflight failed" if preflight_failed else result.status.verdict
    if rec.code != 0:
        err.print(f"[red]preflight failed:[/] {escape(result.status.reason)}", highlight=False)
        rec.message = result.status.reason
    return rec.code


def _report(exp: Any, result: Any, args: RunArgs, run_dir: Path, journal_path: Path, rec: Outcome) -> int:
    """summary.json, report.html (from the journal alone: `chaoskit report` remakes it), JUnit, Markdown; the
    verdict lines."""
    from chaoskit.engine.journal import read_journal
    from chaoskit.report import markdown
    from chaoskit.report.outputs import summary, write_html, write_junit, write_summary
    from chaoskit.report.view import run_view

    code = rec.code
    junit = args.junit or (run_dir / "junit.xml" if args.ci else None)
    view = rec.view = run_view(read_journal(journal_path))
    write_summary(journal_path.with_name("summary.json"), summary(view))
    report_path = rec.report = args.report or run_dir / "report.html"
    write_html(report_path, view)
    if junit:
        write_junit(junit, view)
    md_path = journal_path.with_name("summary.md")
    rec.markdown = markdown.render(view, os.path.relpath(report_path, md_path.parent))
    if args.ci:
        md_path.write_text(rec.markdown, encoding="utf-8")
    style = {0: "green", 1: "yellow"}.get(code, "red")
    out.print(f"[bold {style}]{view.verdict}[/] (exit {code}) {exp.metadata.name}"
              + (f" — {escape(view.reason)}" if view.reason else ""), highlight=False)
    for d in view.deviations:
        out.print(f"  deviation: {d}", highlight=False, markup=False)
    if view.recovery_s is not None:
        out.print(f"  recovered {view.recovery_s:.2f}s after rollback")
    out.print(f"  journal {journal_path}  report {report_path}" + (f"  junit {junit}" if junit else ""))
    if args.ci:
        out.print(f"  summary {md_path}" + (append_step_summary(rec.markdown) if args.step_summary else ""),
                  highlight=False, soft_wrap=True)
    if not view.rollback_complete:
        err.print(f"[bold red]ROLLBACK INCOMPLETE[/]: faults may still be applied. Ledger: {result.ledger_path}\n"
                  "  fix the cause, then run: chaoskit rollback --ledger " + str(result.ledger_path))
    return code


def append_step_summary(markdown: str) -> str:
    """--ci on GitHub Actions: the Markdown summary goes onto the job's page too (what the output line adds)."""
    target = os.environ.get("GITHUB_STEP_SUMMARY")
    if not target:
        return ""
    try:
        with open(target, "a", encoding="utf-8") as fh:
            fh.write(markdown + "\n")
    except OSError as e:
        err.print(f"[yellow]note:[/] could not append to $GITHUB_STEP_SUMMARY ({target}): {escape(str(e))}",
                  highlight=False)
        return ""
    return " (+ $GITHUB_STEP_SUMMARY)"


@app.command()
def validate(files: list[Path] = typer.Argument(..., help="experiment YAML files (or bundled experiments' names)")
             ) -> None:
    """Check experiment files; errors name file:line:column and the field. Exit 2 if any is invalid."""
    from chaoskit.experiment.loader import load_experiment
    from chaoskit.paths import experiment_path

    bad = 0
    for f in map(experiment_path, files):
        try:
            loaded = load_experiment(f, strict=False)
        except ChaoskitError as e:
            bad += 1
            for line in str(e).splitlines():
                err.print(f"[red]✗[/] {escape(line)}", highlight=False, soft_wrap=True)
            continue
        out.print(f"[green]✓[/] {f}: {loaded.experiment.metadata.name} "
                  f"({len(loaded.experiment.method)} steps)", highlight=False)
        for note in loaded.notes:
            out.print(f"  [yellow]note:[/] {escape(note)}", highlight=False)
        for warning in loaded.warnings:
            out.print(f"  [bold yellow]warning:[/] {escape(warning)}", highlight=False)
    raise typer.Exit(errors.EXIT_INVALID if bad else 0)


@app.command()
def rollback(
    ledger: Path | None = typer.Option(None, help="one ledger file to replay"),
    all_: bool = typer.Option(False, "--all", help="every unfinished ledger in the state directory"),
    force: bool = typer.Option(False, help="also revert ledgers whose run still seems alive"),
    cluster: bool = typer.Option(False, "--cluster", help="revert the faults recorded in a Kubernetes cluster's "
                                 "revert ConfigMaps (runs whose host is gone), from any machine"),
    kubeconfig: Path | None = typer.Option(None, help="--cluster: kubeconfig (default $KUBECONFIG, "
                                           "~/.kube/config, the pod's service account)"),
    context: str | None = typer.Option(None, help="--cluster: kubeconfig context"),
    namespace: str = typer.Option("chaoskit", help="--cluster: the namespace of the revert ConfigMaps"),
) -> None:
    """Revert faults left behind by a run that could not (killed, host rebooted). Exit 5 if any revert fails."""
    from chaoskit.engine.ledger import Ledger, open_ledgers
    from chaoskit.engine.rollback import rollback as do_rollback
    from chaoskit.paths import ledger_dir

    if sum((ledger is not None, all_, cluster)) != 1:
        _fail(ChaoskitError("give exactly one of --ledger PATH, --all or --cluster"))
    if cluster:
        _rollback_cluster(kubeconfig, context, namespace)
    if ledger is not None and not ledger.is_file():
        _fail(ChaoskitError(f"{ledger}: no such ledger file"))
    if ledger is not None and not Ledger(ledger).is_ledger():
        _fail(ChaoskitError(f"{ledger}: not a chaoskit ledger (its first line is no 'open' record); nothing written"))
    if ledger is not None:
        _replay_orphans()
    ledgers = [Ledger(ledger)] if ledger else open_ledgers()
    if not ledgers:
        out.print(f"nothing to roll back (no unfinished ledger in {ledger_dir()})")
        raise typer.Exit(0)
    failed = 0
    for lg in ledgers:
        st = lg.read()
        if st.closed:
            out.print(f"{lg.path}: already closed")
            continue
        if st.owner_alive() and not force:
            out.print(f"[yellow]skip[/] {lg.path}: run {st.run_id} is still running (PID {st.owner.pid}); "
                      "it rolls back itself (use --force to override)", highlight=False)
            continue
        result = do_rollback(lg)
        for e in result.reverted:
            out.print(f"[green]reverted[/] #{e.id} {e.type} ({st.run_id})", highlight=False)
        for e, why in result.failed:
            failed += 1
            err.print(f"[bold red]FAILED[/] #{e.id} {e.type} ({st.run_id}): {escape(why)}", highlight=False)
    raise typer.Exit(errors.EXIT_ROLLBACK_INCOMPLETE if failed else 0)


def _rollback_cluster(kubeconfig: Path | None, context: str | None, namespace: str) -> None:
    """`rollback --cluster`: every fault a run left recorded in the cluster, reverted through helper pods."""
    from chaoskit.errors import PreflightError
    from chaoskit.executors.k8s_helper import replay_cluster
    from chaoskit.targets.kube import KubeCluster, resolve_cluster

    try:
        ref = resolve_cluster(KubeCluster(kubeconfig=str(kubeconfig) if kubeconfig else None, context=context))
        results = replay_cluster(ref, namespace)
    except PreflightError as e:
        _fail(e)
    except Exception as e:  # the API server unreachable, RBAC ...: faults may still be in effect
        err.print(f"[bold red]FAILED[/] reading the revert records in namespace {namespace}: "
                  f"{escape(f'{type(e).__name__}: {e}'[:500])}", highlight=False)
        raise typer.Exit(errors.EXIT_ROLLBACK_INCOMPLETE) from None
    if not results:
        out.print(f"nothing to roll back (no revert records in namespace {namespace})")
    for key, why in results:
        if why is None:
            out.print(f"[green]reverted[/] {key}", highlight=False)
        else:
            err.print(f"[bold red]FAILED[/] {key}: {escape(why)}", highlight=False)
    raise typer.Exit(errors.EXIT_ROLLBACK_INCOMPLETE if any(why for _, why in results) else 0)


@app.command()
def doctor(as_json: bool = typer.Option(False, "--json", help="machine-readable output"),
           fix: bool = typer.Option(False, "--fix", help="show the package commands that provide what is missing "
                                                         "and run them (apt hosts, as root)")) -> None:
    """What this host can do: fault families and probes, why not, and the packages that provide the rest."""
    from chaoskit.cli_doctor import doctor_command

    try:
        _replay_orphans()
    except OSError as e:  # a state directory this user cannot write: the checks still run
        err.print(f"[yellow]note:[/] orphaned runs not replayed: {escape(str(e))}", highlight=False)
    doctor_command(as_json, fix)


@app.command()
def schema() -> None:
    """Print the JSON Schema of the experiment file (placeholders and probe includes allowed, as the loader does)."""
    from chaoskit.experiment.schema import experiment_schema

    print(json.dumps(experiment_schema(), indent=2))


@app.command("list")
def list_() -> None:
    """Injectors, probes and bundled experiments, one line each."""
    from chaoskit.experiment.loader import load_experiment
    from chaoskit.injectors import INJECTORS
    from chaoskit.paths import library
    from chaoskit.probes import PROBES

    for title, rows in (("injectors", [(c.type, c.summary) for c in INJECTORS]),
                        ("probes", [(c.type, c.summary) for c in PROBES])):
        table = Table(title=title, title_justify="left")
        table.add_column("type")
        table.add_column("what it does")
        for row in rows:
            table.add_row(*row)
        out.print(table)
    root = library("experiments")
    table = Table(title=f"bundled experiments (chaoskit run NAME; files in {root})", title_justify="left")
    table.add_column("name")
    table.add_column("description")
    for f in sorted(root.rglob("*.yaml")):
        try:
            desc = load_experiment(f, strict=False).experiment.metadata.description
        except ChaoskitError as e:
            desc = f"[red]invalid: {escape(str(e).splitlines()[0])}[/]"
        table.add_row(str(f.relative_to(root).with_suffix("")), desc)
    out.print(table)


@app.command()
def version() -> None:
    """Print the version (the installed package's metadata)."""
    print(f"chaoskit {__version__}")


def main() -> None:
    try:
        app()
    except ChaoskitError as e:  # pragma: no cover - commands catch their own
        err.print(f"error: {e}")
        sys.exit(e.exit_code)


if __name__ == "__main__":
    main()
