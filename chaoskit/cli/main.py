"""The `chaoskit` command line: parse, call the engine, render. Errors become one clear message + exit code."""

from __future__ import annotations

import inspect
import json
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer
from rich.markup import escape

from chaoskit import __version__, errors
from chaoskit.errors import ChaoskitError
from chaoskit.term import Table, console

if TYPE_CHECKING:  # typed records only: the modules load when a command needs them (start-up stays quick)
    from chaoskit.app.orphans import OrphanReplay
    from chaoskit.app.run import Outcome, RunArgs
    from chaoskit.engine.journal import Journal, Listener
    from chaoskit.experiment.loader import Loaded
    from chaoskit.model.events import ExperimentRecorded

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_show_locals=False,
                  help="Chaos engineering and fault injection for LLM inference services.")
out = console()
err = console(stderr=True)


def _add_subcommands() -> None:
    from chaoskit.cli.cuda import cuda_wrap
    from chaoskit.cli.halt import halt, status
    from chaoskit.cli.init import init
    from chaoskit.cli.load import load
    from chaoskit.cli.matrix import matrix
    from chaoskit.cli.ref import ref_app
    from chaoskit.cli.report import report

    app.add_typer(ref_app, name="ref")
    app.command()(init)
    app.command("cuda-wrap")(cuda_wrap)
    app.command()(load)
    app.command()(matrix)
    app.command()(report)
    app.command()(halt)
    app.command()(status)


_add_subcommands()


def _print_version(value: bool) -> None:
    if value:
        print(f"chaoskit {__version__}")
        raise typer.Exit(0)


@app.callback()
def _options(
    show_version: bool = typer.Option(False, "--version", is_eager=True, callback=_print_version,
                                      help="print the installed version (as `chaoskit version`) and exit"),
) -> None:
    """Chaos engineering and fault injection for LLM inference services."""


def _replay_orphans() -> None:
    """Before any command that starts work: finish ledgers left by runs that died together with their watchdog."""
    from chaoskit.app.orphans import replay_orphans
    from chaoskit.cli.ref import say_orphans

    say_orphans(replay_orphans())


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
    metrics_port: int | None = typer.Option(None, "--metrics-port", min=0, max=65535, help="serve the run's "
                                            "Prometheus metrics (fault windows, probe values, phase, verdict) on "
                                            "this port for the life of the run (a suite: of each experiment)"),
    metrics_addr: str = typer.Option("127.0.0.1", "--metrics-addr", help="the address --metrics-port binds "
                                     "(0.0.0.0: every interface)"),
    pushgateway: str | None = typer.Option(None, "--pushgateway", metavar="URL", help="push the final metrics "
                                           "to this Pushgateway, grouped by experiment and run id (for CI runs "
                                           "gone before a scrape)"),
    otlp_endpoint: str | None = typer.Option(None, "--otlp-endpoint", metavar="URL", envvar="OTEL_EXPORTER_OTLP_"
                                             "ENDPOINT", help="export the run as OpenTelemetry traces over OTLP/HTTP "
                                             "(a span for the run, each phase and each fault)"),
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
    from chaoskit.app.run import RunArgs
    from chaoskit.observe.options import ObserveOptions

    live = (out.is_terminal and not ci) if live is None else live
    observe = ObserveOptions(metrics_port, metrics_addr, pushgateway or None, otlp_endpoint or None)
    args = RunArgs(dry_run, cli_vars, journal, junit, report, out_dir, live, step, ci, observe=observe)
    if not suite:
        raise typer.Exit(run_one(files[0], args).code)
    from chaoskit.cli.suite import run_suite

    try:
        code = run_suite(files, args, stop_on_failure, run_one)
    except ChaoskitError as e:
        _fail(e)
    raise typer.Exit(code)


def run_one(file: Path, args: RunArgs) -> Outcome:
    """One experiment, start to end, shown as it runs and said when it ends: its Outcome."""
    from chaoskit.app.run import NotRun
    from chaoskit.app.run import run_one as run_experiment

    rec = run_experiment(file, args, _Display(args))
    if rec.error is not None:
        _say_error(rec.error)
    elif rec.verdict is NotRun.INTERRUPTED:
        err.print("[red]interrupted[/] while the reference deployment was starting (stopped again)")
    elif args.dry_run:
        _print_plan(rec)
    else:
        _print_outcome(rec)
    return rec


def _say_error(e: ChaoskitError) -> None:
    for line in str(e).splitlines():
        err.print(f"[red]error:[/] {escape(line)}", markup=True, highlight=False, soft_wrap=True)


def _fail(e: ChaoskitError) -> None:
    _say_error(e)
    raise typer.Exit(e.exit_code)


class _Display:
    """app.run's Display: the live view on a terminal (plain lines otherwise), notes on stderr, --step."""

    def __init__(self, args: RunArgs):
        self.args = args

    def say(self, text: str) -> None:
        err.print(text, highlight=False)

    def notes(self, loaded: Loaded) -> None:
        for note in loaded.notes:
            err.print(f"[yellow]note:[/] {escape(note)}", highlight=False)
        for warning in loaded.warnings:
            err.print(f"[bold yellow]warning:[/] {escape(warning)}", highlight=False)

    def replayed(self, replays: list[OrphanReplay]) -> None:
        from chaoskit.cli.ref import say_orphans

        say_orphans(replays)

    def listener(self, record: ExperimentRecorded) -> Listener:
        """The live view (what each probe's tolerances judge, the safeguards: from the experiment's record) or
        the plain one."""
        from chaoskit.ui import LiveView, PlainView

        if not self.args.live:
            return PlainView(out)
        return LiveView(out, record.name, {probe: list(keys) for probe, keys in record.expect.items()},
                        record.safeguards)

    def stepper(self, journal: Journal, view: Listener) -> Any:
        from chaoskit.stepper import Stepper
        from chaoskit.ui import View

        return Stepper(out, journal, view if isinstance(view, View) else None)

    def running(self, view: Any, run: Callable[[], None]) -> None:
        if self.args.live:
            with view:
                run()
        else:
            run()


def _print_plan(rec: Outcome) -> None:
    out.print(f"[bold]plan for {rec.experiment}[/] (dry run: nothing applied)")
    for p in rec.result.plan:
        dur = f" for {p.duration_s:g}s" if p.duration_s else " until the end of the method"
        out.print(f"  • {p.step} ({p.type}{dur})")
        for change in p.changes:
            out.print(f"      {change}", highlight=False, markup=False)
    if rec.code != 0:
        err.print(f"[red]preflight failed:[/] {escape(rec.message)}", highlight=False)


def _print_outcome(rec: Outcome) -> None:
    """The verdict lines: what it came to, why, where its files are."""
    view, files = rec.view, rec.files
    from chaoskit.cli.suite import VERDICT_STYLE

    style = VERDICT_STYLE.get(view.verdict, "red")
    out.print(f"[bold {style}]{view.verdict}[/] (exit {rec.code}) {rec.experiment}"
              + (f" — {escape(view.reason)}" if view.reason else ""), highlight=False)
    for d in view.deviations:
        out.print(f"  deviation: {d}", highlight=False, markup=False)
    if view.recovery_s is not None:
        out.print(f"  recovered {view.recovery_s:.2f}s after rollback")
    out.print(f"  journal {files.journal}  report {files.report}" + (f"  junit {files.junit}" if files.junit else ""))
    if files.summary_md is not None:
        from chaoskit.cli.suite import step_summary_note

        out.print(f"  summary {files.summary_md}" + step_summary_note(files.step_summary), highlight=False,
                  soft_wrap=True)
    if not view.rollback_complete:
        ledger = rec.result.ledger_path
        err.print(f"[bold red]ROLLBACK INCOMPLETE[/]: faults may still be applied. Ledger: {ledger}\n"
                  "  fix the cause, then run: chaoskit rollback --ledger " + str(ledger))


def _count(n: int, word: str) -> str:
    return f"{n} {word}" + ("" if n == 1 else "s")


def method_size(steps: list[Any]) -> str:
    """What `validate` says of a method: its steps (the method's own list) and the faults and pauses they hold,
    parallel blocks counted in: `1 step: 3 faults` for one parallel step of three, `2 steps: 1 fault, 1 pause`."""
    faults = pauses = 0
    todo = list(steps)
    while todo:
        step = todo.pop()
        faults += step.inject is not None
        pauses += step.pause is not None
        todo += step.parallel or []
    return f"{_count(len(steps), 'step')}: {_count(faults, 'fault')}" + (f", {_count(pauses, 'pause')}" if pauses
                                                                        else "")


@app.command()
def validate(files: list[Path] = typer.Argument(..., help="experiment YAML files, directories of them (their "
                                                ".yaml and .yml files, as `run` takes them) or bundled experiments' names")
             ) -> None:
    """Check experiment files; errors name file:line:column and the field. Exit 2 if any is invalid."""
    from chaoskit.app.suite import expand
    from chaoskit.paths import experiment_path

    bad = 0
    for given in map(experiment_path, files):
        try:
            found = expand([given])  # a directory stands for its experiment files, as `run` reads it
        except ChaoskitError as e:
            _say_invalid(e)
            bad += 1
            continue
        bad += sum(not _validate_one(f) for f in found)
    raise typer.Exit(errors.EXIT_INVALID if bad else 0)


def _say_invalid(e: ChaoskitError) -> None:
    for line in str(e).splitlines():
        err.print(f"[red]✗[/] {escape(line)}", highlight=False, soft_wrap=True)


def _validate_one(f: Path) -> bool:
    """Load one experiment file as `run` would and say what it holds (or what is wrong): whether it is valid."""
    from chaoskit.experiment.loader import load_experiment

    try:
        loaded = load_experiment(f, strict=False)
    except ChaoskitError as e:
        _say_invalid(e)
        return False
    out.print(f"[green]✓[/] {f}: {loaded.experiment.metadata.name} ({method_size(loaded.experiment.method)})",
              highlight=False)
    for note in loaded.notes:
        out.print(f"  [yellow]note:[/] {escape(note)}", highlight=False)
    for warning in loaded.warnings:
        out.print(f"  [bold yellow]warning:[/] {escape(warning)}", highlight=False)
    return True


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
    print_unit: bool = typer.Option(False, "--print-unit", help="print the systemd unit that runs `rollback --all` "
                                    "at boot with this install of chaoskit and this state directory, and exit"),
) -> None:
    """Revert faults left behind by a run that could not (killed, host rebooted). Exit 5 if any revert fails."""
    if print_unit:
        from chaoskit.app.boot_unit import rollback_unit

        print(rollback_unit(), end="")
        raise typer.Exit(0)
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
    """`rollback --cluster`: every fault a run left recorded in the cluster, reverted through helper pods; a
    record that fails its MAC check is refused (nothing runs on the node for it) and makes the exit 5."""
    from chaoskit.errors import PreflightError
    from chaoskit.executors.k8s_helper import replay_cluster
    from chaoskit.targets.kube import KubeCluster, resolve_cluster

    try:
        ref = resolve_cluster(KubeCluster(kubeconfig=str(kubeconfig) if kubeconfig else None, context=context))
        results = replay_cluster(ref, namespace)
    except PreflightError as e:
        _fail(e)
    except Exception as e:  # the API server unreachable, RBAC, the key Secret ...: faults may still be in effect
        err.print(f"[bold red]FAILED[/] reading the revert records in namespace {namespace}: "
                  f"{escape(f'{type(e).__name__}: {e}'[:500])}", highlight=False)
        raise typer.Exit(errors.EXIT_ROLLBACK_INCOMPLETE) from None
    if not results:
        out.print(f"nothing to roll back (no revert records in namespace {namespace})")
    for r in results:
        if r.error is None:
            out.print(f"[green]reverted[/] {r.key}", highlight=False)
        elif r.refused:
            err.print(f"[bold red]REFUSED[/] {escape(r.error)}; nothing was run on the node\n  check who changed it "
                      f"(kubectl -n {namespace} get configmap {r.configmap} -o yaml), revert by hand what it names "
                      "if it is still in effect, then delete it (the docs' security model)", highlight=False,
                      soft_wrap=True)
        else:
            err.print(f"[bold red]FAILED[/] {r.key}: {escape(r.error)}", highlight=False)
    raise typer.Exit(errors.EXIT_ROLLBACK_INCOMPLETE if any(r.error for r in results) else 0)


@app.command()
def doctor(as_json: bool = typer.Option(False, "--json", help="machine-readable output"),
           fix: bool = typer.Option(False, "--fix", help="show the package commands that provide what is missing "
                                                         "and run them (apt hosts, as root)")) -> None:
    """What this host can do: fault families and probes, why not, and the packages that provide the rest."""
    from chaoskit.cli.doctor import doctor_command

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


def one_line_paragraphs(text: str) -> str:
    """`text` with each paragraph (blank-line separated) on one line: the terminal wraps it, not the source."""
    return "\n\n".join(" ".join(p.split()) for p in inspect.cleandoc(text).split("\n\n"))


def _unwrap_help(typer_app: typer.Typer) -> None:
    """Typer's rich help prints a docstring's line breaks as they are, a summary then breaks mid-sentence where
    the source did: every command's and group's help becomes one-line paragraphs, wrapped at the terminal."""
    for cmd in typer_app.registered_commands:
        doc = cmd.help if isinstance(cmd.help, str) else inspect.getdoc(cmd.callback)
        cmd.help = one_line_paragraphs(doc) if doc else cmd.help
    for group in typer_app.registered_groups:
        if group.typer_instance is not None:
            info = group.typer_instance.info
            info.help = one_line_paragraphs(info.help) if isinstance(info.help, str) else info.help
            _unwrap_help(group.typer_instance)


_unwrap_help(app)


def main() -> None:
    # Ctrl-C (SIGINT) stops chaoskit also where it came in ignored: a job started with `&` by a non-interactive
    # shell, as CI runners do, gets SIGINT ignored, and Python then installs no handler of its own
    signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        app()
    except ChaoskitError as e:  # pragma: no cover - commands catch their own
        err.print(f"error: {e}")
        sys.exit(e.exit_code)


if __name__ == "__main__":
    main()
