"""One experiment, start to end: load it, refuse it while a halt lever is pulled, bring up the deployment it
declares, run it (halted when a lever is pulled) with the display the caller gives, write its outputs; what it
came to is an Outcome (never an exception the caller must catch)."""

from __future__ import annotations

import asyncio
import faulthandler
import os
import signal
from collections.abc import Awaitable, Callable
from contextlib import ExitStack
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any, Protocol

from chaoskit import errors
from chaoskit.app.halt import Levers, refuse_if_halted
from chaoskit.app.orphans import OrphanReplay, replay_orphans
from chaoskit.app.outputs import RunFiles, write_outputs
from chaoskit.engine.journal import Journal, Listener
from chaoskit.engine.runner import RunResult
from chaoskit.errors import ChaoskitError, PreflightError
from chaoskit.experiment.loader import Loaded
from chaoskit.experiment.models import Reference, Step
from chaoskit.model.enums import RunVerdict
from chaoskit.model.events import ExperimentRecorded, PlanStep
from chaoskit.observe.options import ObserveOptions
from chaoskit.report.view import RunView


class NotRun(StrEnum):
    """Why an experiment came to no run (its verdict where a run's would be)."""

    INVALID = "invalid"
    PREFLIGHT = "preflight failed"
    INTERRUPTED = "interrupted"


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
    observe: ObserveOptions = field(default_factory=ObserveOptions)  # --metrics-port, --pushgateway, --otlp-endpoint


@dataclass
class Outcome:
    """What one experiment of a run came to (a suite's table, JUnit file and index are made of these)."""

    file: Path
    code: int = errors.EXIT_INVALID
    experiment: str = ""
    verdict: RunVerdict | NotRun | None = None  # the run's, or why it came to none
    error: ChaoskitError | None = None  # what stopped it before it ran (the file, the host, the deployment)
    message: str = ""
    result: RunResult | None = None  # the engine's result, once it ran (a dry run too)
    view: RunView | None = None  # the run as its journal tells it (not for a dry run)
    files: RunFiles | None = None


class Display(Protocol):
    """What the caller shows while one experiment runs."""

    def say(self, text: str) -> None: ...  # progress of the deployment

    def notes(self, loaded: Loaded) -> None: ...  # the loader's notes and warnings

    def replayed(self, replays: list[OrphanReplay]) -> None: ...

    def listener(self, record: ExperimentRecorded) -> Listener: ...  # the live or plain view

    def stepper(self, journal: Journal, view: Listener) -> Callable[[Step, list[PlanStep]], Awaitable[str]]: ...

    def running(self, view: Listener, run: Callable[[], None]) -> None: ...  # runs `run` with the view shown


def run_one(file: Path, args: RunArgs, display: Display) -> Outcome:
    rec = Outcome(file)
    try:
        _run(file, args, display, rec)
    except ChaoskitError as e:
        rec.code, rec.error, rec.message = e.exit_code, e, str(e)
        rec.verdict = NotRun.PREFLIGHT if isinstance(e, PreflightError) else NotRun.INVALID
    except _Interrupted:
        rec.code, rec.verdict = errors.EXIT_SIGINT, NotRun.INTERRUPTED
        rec.message = "interrupted while the reference deployment was starting"
    return rec


class _Interrupted(Exception):
    """Ctrl-C (or SIGTERM) while the deployment started; what started was stopped again."""


def _run(file: Path, args: RunArgs, display: Display, rec: Outcome) -> None:
    from chaoskit.engine.runner import new_run_id
    from chaoskit.experiment.loader import load_experiment

    loaded = load_experiment(file, args.cli_vars, strict=not args.dry_run)
    if not args.dry_run:  # first: a halted host is the one that most needs what a dead run left taken back
        display.replayed(replay_orphans())
    levers = _levers(loaded, args, display)
    exp = loaded.experiment
    rec.experiment = exp.metadata.name
    own = exp.target.reference.effective(loaded.variables) if isinstance(exp.target.reference, Reference) else None
    run_id = new_run_id(exp.metadata.name)
    run_dir = args.out_dir or Path("chaoskit-runs") / run_id
    journal_path = args.journal or run_dir / "journal.jsonl"
    with ExitStack() as deployed:
        facts = None
        if own is not None:
            loaded, facts = _deploy(deployed, own, loaded, file, args, run_id, display)
            if levers is not None:  # pulled while the deployment started: refused, the deployment stopped
                refuse_if_halted(levers, lambda text: display.say(f"[yellow]note:[/] {text}"))
        check = None if args.dry_run else _service_check(loaded, facts)
        rec.result = _execute(loaded, args, journal_path, run_id, display, levers, check)
        if own is not None and not args.dry_run:
            for sig in (signal.SIGINT, signal.SIGTERM):  # the deployment is stopping: let it finish (≤ 15 s)
                signal.signal(sig, signal.SIG_IGN)
    rec.code = rec.result.exit_code
    rec.verdict = _dry_verdict(rec.result) if args.dry_run else None
    if not args.dry_run:
        rec.view, rec.files = write_outputs(journal_path, args, run_dir)
        rec.verdict = rec.view.verdict
    elif rec.code != 0:
        rec.message = rec.result.status.reason


def _levers(loaded: Loaded, args: RunArgs, display: Display) -> Levers | None:
    """The halt levers the run obeys (none for a dry run); PreflightError (exit 4) while one is pulled."""
    from chaoskit.app.halt import clusters_of

    if args.dry_run:
        return None
    levers = Levers(clusters_of(loaded.experiment))
    refuse_if_halted(levers, lambda text: display.say(f"[yellow]note:[/] {text}"))
    return levers


def _dry_verdict(result: RunResult) -> RunVerdict | NotRun:
    from chaoskit.engine.states import FailureKind

    return NotRun.PREFLIGHT if result.status.failure is FailureKind.PREFLIGHT else result.status.verdict


_MAIN_PID = os.getpid()


def _term_as_interrupt(signum: int, _frame: object) -> None:
    """SIGTERM while the deployment starts: unwind like Ctrl-C, so what started is stopped. Only here: a child
    forked by a library (pyroute2's netns helper) that inherits this handler just dies of the signal."""
    if os.getpid() != _MAIN_PID:
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)
        return
    raise KeyboardInterrupt


def _host_preflight(loaded: Loaded) -> None:
    """Before starting a deployment: the faults that do not need its facts must be possible on this host
    (a GPU-only scenario on a CPU host is refused at once, not after the replicas are up)."""
    from chaoskit.engine.plan import deferred_paths, plan_faults

    _, _, problems = plan_faults(loaded.experiment.method, deferred_paths(loaded.deferred))
    if problems:
        raise PreflightError("\n".join(problems) + "\n(the reference deployment was not started)")


def _service_check(loaded: Loaded, facts: dict[str, Any] | None
                   ) -> Callable[[frozenset[tuple[int, int]]], list[str]] | None:
    """The after phase's check of a reference deployment's replicas (the one the experiment brought up, or
    the running one `target.reference: ENGINE` names), or None for any other target."""
    from chaoskit.reference.replica_check import ReplicaCheck
    from chaoskit.targets.facts import reference_facts

    ref = loaded.experiment.target.reference
    if facts is None and isinstance(ref, str):
        try:
            facts = reference_facts(ref)
        except PreflightError:
            return None  # the loader found its facts, so this is a race with `ref down`: the probes will say
    return ReplicaCheck(facts, loaded.experiment.target.may_exit) if facts else None


def _deploy(deployed: ExitStack, own: Reference, loaded: Loaded, file: Path, args: RunArgs, run_id: str,
            display: Display) -> tuple[Loaded, dict[str, Any] | None]:
    """Bring up (or reuse) the deployment the experiment declares, inside `deployed`; the experiment loaded
    again with its facts, and the facts. A dry run starts nothing."""
    from chaoskit.experiment.loader import load_experiment
    from chaoskit.reference.scenario import deployment_for, describe, looked_in, running_facts

    if args.dry_run:
        facts = running_facts(own)
        if facts is None:
            where = ", ".join(map(str, dict.fromkeys(looked_in(own))))
            display.say(f"[yellow]note:[/] would start the reference deployment: {describe(own)} (none running "
                        f"with these settings in {where})")
            return loaded, None
        display.say(f"[yellow]note:[/] would reuse the running reference deployment at {facts['url']}: "
                    f"{describe(own)}")
        return load_experiment(file, args.cli_vars, strict=False, deployed=facts), facts
    signal.signal(signal.SIGTERM, _term_as_interrupt)  # a stop while it starts: stop what started
    try:
        _host_preflight(loaded)
        facts = deployed.enter_context(deployment_for(own, run_id, loaded.experiment.metadata.name, display.say))
        return load_experiment(file, args.cli_vars, deployed=facts), facts
    except KeyboardInterrupt:
        deployed.close()
        raise _Interrupted from None
    except ChaoskitError:
        deployed.close()
        raise


def _execute(loaded: Loaded, args: RunArgs, journal_path: Path, run_id: str, display: Display,
             levers: Levers | None,
             service_check: Callable[[frozenset[tuple[int, int]]], list[str]] | None = None) -> RunResult:
    """Journal, view, runner: run the experiment, watching the halt levers (not in a dry run). A dry run plans
    the steps whose target needs facts not known yet as "at run time", never with a stand-in that could select
    more."""
    from chaoskit.app.halt import watch
    from chaoskit.engine.plan import deferred_paths
    from chaoskit.engine.runinfo import experiment_record, host_facts
    from chaoskit.engine.runner import Runner, RunOptions
    from chaoskit.engine.safeguards import halt_interval
    from chaoskit.observe.exporters import Exporters
    from chaoskit.observe.fault_feed import FaultFeed

    display.notes(loaded)
    ss = loaded.experiment.steady_state
    for note in (n for p in ss.probes for n in p.after_notes(ss.after.within)):
        display.say(f"[yellow]note:[/] {note}")
    record = experiment_record(loaded)
    view = display.listener(record)
    jr = Journal(None if args.dry_run else journal_path, [view])
    unresolved = deferred_paths(loaded.deferred) if args.dry_run else frozenset()
    stepper = display.stepper(jr, view) if args.step else None
    runner = Runner(loaded.experiment, jr, RunOptions(dry_run=args.dry_run, unresolved_steps=unresolved,
                                                      before_step=stepper, service_check=service_check),
                    run_id=run_id)
    jr.sinks.append(FaultFeed(lambda: [*runner.probes.values(), *(p for _, p in runner.safeguard_probes)]))
    try:
        faulthandler.register(signal.SIGUSR1, all_threads=True)  # kill -USR1 PID: every thread's stack on stderr
    except (AttributeError, ValueError, OSError):  # a stderr with no file descriptor (output captured in-process)
        pass

    async def main() -> None:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, runner.interrupt, sig)
        if levers is None:
            await runner.execute()
            return
        every = halt_interval(loaded.experiment)
        watching = asyncio.create_task(watch(runner, levers, every, lambda t: display.say(f"[yellow]note:[/] {t}")))
        try:
            await runner.execute()
        finally:
            watching.cancel()
            await asyncio.gather(watching, return_exceptions=True)

    observe = ObserveOptions() if args.dry_run else args.observe
    with Exporters(observe, loaded.experiment.metadata.name, run_id, jr, display.say):
        if not args.dry_run:  # what the report needs besides the events: the experiment as run, the host
            jr.record(record)
            jr.record(host_facts())
        display.running(view, lambda: asyncio.run(main()))
    jr.close()
    return runner.result

