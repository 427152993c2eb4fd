"""Run one experiment: preflight, hypothesis before, method with continuous probes and safeguards,
guaranteed rollback, hypothesis after with recovery time. Status changes only through RunStatus."""

from __future__ import annotations

import asyncio
import logging
import signal
import time
import traceback
import uuid
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from chaoskit.engine.faults import FaultFailed, Faults
from chaoskit.engine.journal import Journal
from chaoskit.engine.ledger import Ledger
from chaoskit.engine.plan import inject_steps, plan_faults, step_path
from chaoskit.engine.safeguards import take_guarded, tripped
from chaoskit.engine.spans import Cut, Spans, final_samples
from chaoskit.engine.states import Event, FailureKind, RunStatus, State
from chaoskit.engine.steady_state import Baselines, take_sample
from chaoskit.errors import PreflightError
from chaoskit.experiment.models import Experiment, Safeguard, Step
from chaoskit.injectors import Injector
from chaoskit.injectors.base import LOCAL
from chaoskit.injectors.forkserver.client import Forkserver
from chaoskit.model.enums import Phase, Verdict
from chaoskit.model.events import (
    JOURNAL_VERSION,
    ErrorNoted,
    Interrupted,
    Paused,
    Planned,
    PlanStep,
    Recovered,
    RunEnded,
    RunStarted,
    SafeguardTripped,
    Sample,
    ServiceChecked,
    StateChanged,
    TargetExited,
)
from chaoskit.probes import Probe, probe_class
from chaoskit.probes.continuous import Continuous

THREADS = 32  # the run loop's worker threads (asyncio.to_thread): waits, not CPU

log = logging.getLogger(__name__)


@dataclass
class RunOptions:
    dry_run: bool = False
    ledger_dir: Path | None = None
    use_watchdog: bool = True
    unresolved_steps: frozenset[str] = frozenset()  # dry run: paths of the steps whose target is not known yet
    before_step: Callable[[Step, list[PlanStep]], Awaitable[str]] | None = None  # --step: continue|skip|abort
    # the after phase: what is wrong with the target service, given the processes the run's faults ended (pid, start)
    service_check: Callable[[frozenset[tuple[int, int]]], list[str]] | None = None


@dataclass
class RunResult:
    run_id: str
    status: RunStatus
    plan: list[PlanStep] = field(default_factory=list)
    recovery_s: float | None = None
    ledger_path: str | None = None
    started: float = 0.0
    ended: float = 0.0

    @property
    def exit_code(self) -> int:
        return self.status.exit_code()


def _window(sample: Sample) -> tuple[float, float]:
    """The wall-clock span a sample measured: from its start for as long as it took."""
    return sample.t, sample.t + (sample.duration_ms or 0.0) / 1000


def new_run_id(name: str) -> str:
    return time.strftime("%Y%m%dT%H%M%S") + f"-{name}-{uuid.uuid4().hex[:6]}"


class Runner:
    def __init__(self, experiment: Experiment, journal: Journal, options: RunOptions | None = None,
                 run_id: str | None = None):
        self.exp = experiment
        self.journal = journal
        self.opts = options or RunOptions()
        self.status = RunStatus(on_change=self._on_state)
        self.result = RunResult(run_id or new_run_id(experiment.metadata.name), self.status)
        self.probes: dict[str, Probe] = {}
        self.baselines = Baselines()  # the before phase's values: what `baseline` in a tolerance means
        self.safeguard_probes: list[tuple[Safeguard, Probe]] = []
        self.injectors: dict[str, Injector] = {}  # step path -> injector
        self.faults: Faults | None = None  # once the ledger exists
        self.forkserver = Forkserver()  # the proxy helpers' (a process from the first proxy to the run's end)
        self._method_task: asyncio.Task | None = None
        self._in_effect: asyncio.Event | None = None  # set once the method's first fault is applied
        self._active = 0  # faults in effect now: "during" samples are judged only while one is
        self._applied_at = 0.0  # monotonic time of the latest apply (steadyState.during.grace counts from it)
        self._applies = 0  # faults applied so far: a sample that saw this change saw a fault come in
        self._judged: list[tuple[str, float, float]] = []  # (probe, wall-clock window) of each judged sample
        self._sampling = False  # samplers loop while this holds, so a cancel a probe swallows still stops them
        self._blocks = 0  # parallel blocks started (each names the group of its faults in the ledger)
        self._unapplied = 0  # inject steps of the method neither applied nor skipped yet
        self._applying = 0  # applies under way
        self.spans = Spans()  # continuous probes judged in the current span of faults in effect
        self._deviated: set[str] = set()  # probes that deviated during the method (the first one is the news)
        self._lost: list[TargetExited] = []  # target exits not declared expected: the run is never recovered

    # -- events -------------------------------------------------------------------------------------
    def _on_state(self, old: State, new: State, reason: str) -> None:
        self.journal.emit(StateChanged(t=self.status.history[-1][1], state=new.value, previous=old.value,
                                       reason=reason))

    def _record(self, sample: Sample) -> None:
        self.journal.emit(sample)  # kept only there: summary.json reads it back

    # -- signals and halt levers ----------------------------------------------------------------------
    def interrupt(self, signum: int) -> None:
        """SIGINT/SIGTERM: stop the method; rollback still runs in full."""
        first = self.status.signal is None
        self.status.interrupt(signum)
        if first:
            self.journal.emit(Interrupted(signal=signal.Signals(signum).name))
        if self._method_task is not None and not self._method_task.done():
            self._method_task.cancel()

    def halt(self, reason: str, pulled: str = "") -> None:
        """A halt lever was seen (`reason`: `halted: WHY`; `pulled`: by whom, where, when): the state machine
        records it, the method stops like a tripped safeguard's, the rollback runs in full, the run ends aborted."""
        if self.status.terminal or not self.status.halt(reason):
            return
        self.journal.emit(SafeguardTripped(probe="halt", reason=f"{reason} (pulled {pulled})" if pulled else reason))
        if self._method_task is not None and not self._method_task.done():
            self._method_task.cancel()

    # -- phases ---------------------------------------------------------------------------------------
    async def execute(self) -> RunResult:
        r = self.result
        r.started = time.time()
        # the loop's threads mostly wait (a helper's `ready`, a probe's answer, an fsync): asyncio's default of
        # cores + 4 let a 100-fault parallel step apply 6 at a time on 2 cores
        asyncio.get_running_loop().set_default_executor(ThreadPoolExecutor(THREADS, thread_name_prefix="chaoskit"))
        self.journal.emit(RunStarted(t=r.started, run_id=r.run_id, experiment=self.exp.metadata.name,
                                     dry_run=self.opts.dry_run, journal=JOURNAL_VERSION))
        try:
            await self._execute()
        except Exception as e:  # an engine bug: still roll back, then fail loudly
            self.journal.emit(ErrorNoted(where="engine", error=f"{type(e).__name__}: {e}",
                                         traceback=traceback.format_exc()))
            if self.status.on(Event.ENGINE_ERROR, f"internal error: {type(e).__name__}: {e}") is State.ROLLBACK:
                await self._rollback()
                self.status.on(Event.ROLLBACK_DONE)
        finally:
            for p in [*self.probes.values(), *(p for _, p in self.safeguard_probes)]:
                try:
                    await p.close()
                except Exception:
                    pass
            await asyncio.to_thread(self.forkserver.close)
        r.ended = time.time()
        self.journal.emit(RunEnded(t=r.ended, verdict=self.status.verdict, exit_code=self.status.exit_code(),
                                   reason=self.status.reason, deviations=self.status.deviations,
                                   recovery_s=r.recovery_s))
        return r

    async def _execute(self) -> None:
        """Report each phase's outcome to the state machine; it decides what comes next."""
        st = self.status
        st.dry_run = self.opts.dry_run
        st.on(Event.BEGIN)
        st.on(Event.VALIDATED)
        try:
            self._preflight()
        except PreflightError as e:
            st.on(Event.PREFLIGHT_FAILED, str(e))
            return
        if st.on(Event.PREFLIGHT_OK) is not State.HYPOTHESIS_BEFORE:
            return
        if any(i.forked and i.ctx.executor == LOCAL for i in self.injectors.values()):
            self.forkserver.prestart()  # while the steady state is checked: ready before the first proxy
        held = bool(await self._cancellable(self._check_once(Phase.BEFORE)))
        if not held and not self.status.stopped:
            st.deviate("steady state did not hold before the method; nothing was injected")
        if held and not self.status.stopped:
            ledger = Ledger.create(self.result.run_id, self.exp.metadata.name, self.opts.ledger_dir)
            self.result.ledger_path = str(ledger.path)
            self.faults = Faults(self.journal, ledger, self.exp.target.may_exit, self._target_exited)
            if self.opts.use_watchdog and (why := await self.faults.start_watchdog()):
                st.on(Event.WATCHDOG_FAILED, why)
        watching = asyncio.create_task(self.faults.supervise_targets()) if self.faults is not None else None
        try:
            if st.state is State.HYPOTHESIS_BEFORE and st.on(Event.BEFORE_CHECKED) is State.METHOD:
                st.aborted = await self._method() or ""
                st.on(Event.METHOD_DONE)
            await self._rollback()
            if st.on(Event.ROLLBACK_DONE) is State.HYPOTHESIS_AFTER:
                await self._after()
                st.on(Event.AFTER_DONE)
        finally:  # the targets are watched from the first apply to the end of the after phase
            if watching is not None:
                watching.cancel()
                await asyncio.gather(watching, return_exceptions=True)

    def _preflight(self) -> None:
        problems: list[str] = []
        for spec in self.exp.steady_state.probes:
            self.probes[spec.name] = probe_class(spec.type)(spec)
        for sg in self.exp.safeguards:
            if not isinstance(sg.probe, str):
                self.safeguard_probes.append((sg, probe_class(sg.probe.type)(sg.probe)))
        for p in [*self.probes.values(), *(p for _, p in self.safeguard_probes)]:
            try:
                p.preflight()
            except PreflightError as e:
                problems.append(str(e))
        self.injectors, plan, more = plan_faults(self.exp.method, self.opts.unresolved_steps,
                                                 self.result.run_id, self.forkserver)
        problems += more
        self.result.plan = plan
        self.journal.emit(Planned(steps=plan))
        if problems:
            raise PreflightError("\n".join(problems))

    async def _check_once(self, phase: Phase) -> bool:
        """Sample every probe of `phase` at once; each sample is journaled as it ends (the log in time order)."""
        tasks = [asyncio.create_task(take_sample(p, phase, self.baselines))
                 for p in self.probes.values() if phase in p.spec.phases]
        held = True
        try:
            for done in asyncio.as_completed(tasks):
                s = await done
                self._record(s)
                held = held and s.verdict is Verdict.OK
        finally:  # cancelled (an interrupt): so are the samples still out
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        return held

    # -- method ---------------------------------------------------------------------------------------
    async def _method(self) -> str | None:
        """Run the steps with continuous probing; return an abort reason if a safeguard tripped."""
        abort: list[str] = []
        self._in_effect = asyncio.Event()
        self._sampling = True
        self._unapplied = len(inject_steps(self.exp.method))
        samplers = self._start_samplers(abort)
        if self.faults is not None and self.opts.use_watchdog:
            samplers.append(asyncio.create_task(self.faults.supervise_watchdog()))
        try:
            await self._cancellable(self._steps_then_end(abort))
        except FaultFailed as e:
            self.status.fail(FailureKind.APPLY, str(e))
        finally:
            self._sampling = False
            for t in samplers:
                t.cancel()
            await asyncio.gather(*samplers, return_exceptions=True)
            await self._stop_during_only()
        if not abort and not self.status.stopped and self.status.failure is None:
            self._deviate_unjudged()
        return abort[0] if abort else None

    def _deviate_unjudged(self) -> None:
        """A fault no sample judged, or a probe of the during phase that judged nothing while a fault was in
        effect (its samples all in grace, or its only one still out when the method ended: it is dropped), cannot
        let the run hold."""
        spans = self._fault_spans()

        def judged(span: tuple[str, float, float], probe: str | None = None) -> bool:
            return any(t0 <= span[2] and t1 >= span[1] for name, t0, t1 in self._judged if probe in (None, name))

        how = "sample more often: steadyState.during.every, or shorten steadyState.during.grace"
        if unjudged := [f"{s[0]} ({s[2] - s[1]:.1f}s)" for s in spans if not judged(s)]:
            self.status.deviate("no sample was judged while these faults were in effect, so the run cannot hold: "
                                f"{', '.join(unjudged)} ({how})")
        elif silent := [name for name, p in self.probes.items()
                        if spans and "during" in p.spec.phases and not any(judged(s, name) for s in spans)]:
            self.status.deviate("these probes of the during phase judged no sample while a fault was in effect, so "
                                f"the run cannot hold: {', '.join(silent)} (a sample slower than "
                                f"steadyState.during.every skips the slots it missed: let the faults last longer, {how})")

    async def _steps_then_end(self, abort: list[str]) -> None:
        await self._steps(self.exp.method, "method", abort)
        if self.spans.open and not abort:  # faults without a duration are still in effect: the span ends here
            await self._final_samples(await self._end_span(stop_last=False))

    async def _stop_during_only(self) -> None:
        """Continuous probes not sampled after the method stop their load (one through a proxy that exists only
        during the method would go on sending to a closed port)."""
        for probe in self.probes.values():
            if isinstance(probe, Continuous) and probe.is_continuous and "after" not in probe.spec.phases:
                try:
                    await probe.close()
                except Exception as e:
                    log.warning("closing probe %s: %s", probe.spec.name, e)

    async def _steps(self, steps: list[Step], parent: str, abort: list[str]) -> None:
        for i, step in enumerate(steps):
            path = step_path(parent, i)
            if self.opts.before_step is not None and step.pause is None:  # --step: the operator decides
                plans = [p for p in self.result.plan if p.path == path or p.path.startswith(path + ".")]
                choice = await self.opts.before_step(step, plans)
                if choice == "abort":  # like a safeguard: stop here, everything applied is rolled back
                    abort.append(f"aborted by the operator before step {step.label()}")
                    return
                if choice == "skip":
                    self._unapplied -= len(plans)
                    continue
            await self._step(step, path)

    async def _cancellable(self, coro: Any) -> Any:
        """Run `coro` as the task that interrupts and safeguards cancel; a cancel returns None."""
        self._method_task = asyncio.create_task(coro)
        if self.status.stopped:
            self._method_task.cancel()
        try:
            return await self._method_task
        except asyncio.CancelledError:
            if not self._method_task.cancelled():
                raise  # we ourselves were cancelled from outside
            return None
        finally:
            self._method_task = None

    def _start_samplers(self, abort: list[str]) -> list[asyncio.Task]:
        during = self.exp.steady_state.during
        every = during.every if during else 1.0
        guards_by_probe: dict[str, list[Safeguard]] = {}
        for sg in self.exp.safeguards:
            if isinstance(sg.probe, str):
                guards_by_probe.setdefault(sg.probe, []).append(sg)
        tasks = []
        for name, probe in self.probes.items():
            guards = guards_by_probe.get(name, [])
            judged = during is not None and "during" in probe.spec.phases
            if judged or guards:
                interval = min([every] + [g.every for g in guards if g.every]) if guards else every
                tasks.append(asyncio.create_task(self._sample_loop(probe, interval, judged, guards, abort)))
        for sg, probe in self.safeguard_probes:
            tasks.append(asyncio.create_task(self._sample_loop(probe, sg.every or every, False, [sg], abort)))
        return tasks

    async def _sample_loop(self, probe: Probe, every: float, judged: bool, guards: list[Safeguard],
                           abort: list[str]) -> None:
        assert self._in_effect is not None
        during = self.exp.steady_state.during
        grace = during.grace if during else 0.0
        between = during.between if during else "judge"
        if not guards:  # "during" means while a fault is in effect; safeguards watch the applies too
            await self._in_effect.wait()
        start = time.monotonic()
        continuous = probe if isinstance(probe, Continuous) and probe.is_continuous else None
        # a probe stops at the last revert (the after phase judges what follows), but with between: record, one
        # that goes on into the after phase is recorded through a pause that ends the method
        stops_at_last_revert = judged and not guards and not (
            between == "record" and self.exp.method[-1].pause is not None and "after" in probe.spec.phases)
        while self._sampling and probe.spec.name not in self.spans.finished:
            if stops_at_last_revert and self._unapplied == 0 and self._active == 0 and not self._applying:
                return
            in_effect, applies = self._active > 0, self._applies
            graced = in_effect and time.monotonic() - self._applied_at < grace
            judging = judged and not graced and (in_effect or between == "judge")
            if judging and continuous is not None:
                self.spans.begin(probe, continuous)
            interim = judging and continuous is not None and continuous.over_phase
            # grace and between exist only where the experiment asks for them (steadyState.during): grace, a
            # fault is in effect but the system may still be adapting to it; between, no fault is in effect;
            # interim: judged once over the span, at its end (over: phase), not sample by sample
            phase = Phase.INTERIM if interim else (Phase.DURING if judging else (
                Phase.GRACE if judged and graced else (Phase.BETWEEN if judged else Phase.SAFEGUARD)))
            loads = continuous.loads_started if continuous is not None else 0
            sample = await take_guarded(probe, phase, guards, self.baselines)
            if probe.spec.name in self.spans.finished and (isinstance(sample, str) or sample.verdict is Verdict.ERROR):
                return  # its load stopped at the end of its last phase while this sample waited for a window
            if isinstance(sample, str):  # a latency safeguard tripped while the probe was still out
                self._trip(probe, sample, abort)
                return
            if continuous is None and phase is Phase.BETWEEN and (self._active > 0 or self._applies != applies):
                # a fault came in while it was taken (a continuous probe's span begins at its next sample)
                sample = sample.model_copy(update={"phase": Phase.DURING})
                judging = True
            elif continuous is not None and judging and between == "record" and self._active == 0 and (
                    continuous.loads_started != loads):
                # its span was cut while it waited: it reports the load that started after the revert
                sample = sample.model_copy(update={"phase": Phase.BETWEEN})
                judging = False
            self._record(sample)
            if judging:  # an interim sample's requests are judged by its span's final sample
                self._judged.append((probe.spec.name, *_window(sample)))
            if judging and not interim and sample.verdict is not Verdict.OK:
                self._deviate(sample)
            for g in guards:
                reason = tripped(g, sample)
                if reason:
                    self._trip(probe, reason, abort)
                    return
            # next slot on the fixed grid; slots missed by a slow sample are skipped, not bunched
            elapsed = time.monotonic() - start
            await asyncio.sleep((int(elapsed / every) + 1) * every - elapsed)

    def _fault_spans(self) -> list[tuple[str, float, float]]:
        """(step, applied, reverted or now) of each fault that was in effect (by its own observation at apply),
        where the experiment judges the during phase."""
        during = self.exp.steady_state.during
        if self.faults is None or during is None or not any("during" in p.spec.phases for p in self.probes.values()):
            return []
        return [(f.step, f.applied_at, f.reverted_at or time.time()) for f in self.faults.faults.values()
                if f.applied_at is not None and f.observed.get("applied", {}).get("in_effect", True) is not False]

    def _deviate(self, sample: Sample) -> None:
        if sample.probe not in self._deviated:  # the first deviation of each probe is the news; the journal has all
            self._deviated.add(sample.probe)
            self.status.deviate(f"{sample.probe} deviated during the method: "
                                + sample.why())

    async def _end_span(self, stop_last: bool) -> tuple[list[Cut], float]:
        """A span with faults in effect ends, before its revert: its continuous probes are cut there (spans);
        the cuts and when they were made."""
        at = time.time()
        return await self.spans.cut(stop_last, {n for n, p in self.probes.items() if "after" in p.spec.phases}), at

    async def _final_samples(self, span: tuple[list[Cut], float]) -> None:
        """The final samples of a span's continuous probes: what they judge ended at the cut, before the revert."""
        cuts, cut_at = span
        for sample in await final_samples(cuts, self.baselines):
            self._record(sample)
            self._judged.append((sample.probe, cut_at, cut_at))
            if sample.verdict is not Verdict.OK:
                self._deviate(sample)

    def _trip(self, probe: Probe, reason: str, abort: list[str]) -> None:
        if not abort:
            abort.append(reason)
            self.journal.emit(SafeguardTripped(probe=probe.spec.name, reason=reason))
            if self._method_task is not None:
                self._method_task.cancel()

    async def _step(self, step: Step, path: str, group: str | None = None) -> None:
        if step.pause is not None:
            self.journal.emit(Paused(seconds=step.pause))
            await asyncio.sleep(step.pause)
        elif step.parallel:
            self._blocks += 1
            block = f"parallel-{self._blocks}"  # its faults were applied at once: their reverts may run at once
            tasks = [asyncio.create_task(self._step(s, step_path(f"{path}.parallel", i), block))
                     for i, s in enumerate(step.parallel)]
            try:
                await asyncio.gather(*tasks)
            finally:
                for t in tasks:
                    t.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)
        else:
            await self._inject(step, path, group)

    async def _inject(self, step: Step, path: str, group: str | None) -> None:
        assert self.faults is not None
        self._unapplied -= 1
        self._applying += 1
        try:
            entry_id = await self.faults.apply(step, self.injectors[path], group)
        finally:
            self._applying -= 1
        self._active += 1
        self._applied_at = time.monotonic()
        self._applies += 1
        if self._in_effect is not None:
            self._in_effect.set()
        if step.duration is None:
            return  # stays until the rollback phase
        await asyncio.sleep(step.duration)
        self._active -= 1  # from here on, samples see the revert, not the fault
        cut = await self._end_span(stop_last=self._unapplied == 0) if self._active == 0 and self.spans.open \
            else ([], 0.0)
        await self.faults.end(entry_id, step.label())
        await self._final_samples(cut)

    # -- rollback and after ---------------------------------------------------------------------------
    async def _rollback(self) -> None:
        if self.faults is None:
            return
        failed = await self.faults.rollback()
        if failed:
            self.status.rollback_incomplete = True
            self.status.reason = "; ".join(failed)

    def _target_exited(self, exit: TargetExited) -> None:
        """A target process (or its service) exited from the apply to the end of the after phase: unless the
        experiment said its targets may exit, the run deviates and is not called recovered."""
        if not exit.expected:
            self._lost.append(exit)
            self.status.deviate(f"{exit.step}: {exit.text}")

    async def _service_problems(self) -> list[str]:
        """What the service check (a reference deployment's replicas) finds wrong now; journaled."""
        if self.opts.service_check is None:
            return []
        try:
            ended = frozenset(self.faults.ended if self.faults is not None else ())
            problems = await asyncio.to_thread(self.opts.service_check, ended)
        except Exception as e:  # a check that cannot run is a problem, not a crash
            problems = [f"the service check failed: {type(e).__name__}: {e}"]
        self.journal.emit(ServiceChecked(problems=problems))
        return problems

    async def _after(self) -> None:
        """Check the hypothesis (and the service) until it holds, `within` passes, or a target exited: a dead
        target does not come back, so no recovery is waited for or declared over it."""
        after = self.exp.steady_state.after
        start = time.monotonic()
        while True:
            held = await self._check_once(Phase.AFTER)
            problems = await self._service_problems()
            if self.faults is not None:
                self.faults.check_targets()
            if held and not problems and not self._lost:
                self.result.recovery_s = round(time.monotonic() - start, 3)
                self.journal.emit(Recovered(seconds=self.result.recovery_s))
                break
            if self._lost:
                self.status.deviate("not recovered: target process" + ("es " if len(self._lost) > 1 else " ")
                                    + ", ".join(f"{e.pid} ({e.comm})" for e in self._lost) + " exited")
                break
            if self.status.stopped:
                break
            if time.monotonic() - start >= after.within:
                self.status.deviate(f"steady state did not hold again within {after.within:g}s after rollback"
                                    + (f": {'; '.join(problems)}" if problems else ""))
                break
            await asyncio.sleep(after.every)
