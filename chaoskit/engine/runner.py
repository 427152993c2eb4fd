"""Run one experiment: preflight, hypothesis before, method with continuous probes and safeguards,
guaranteed rollback, hypothesis after with recovery time. Status changes only through RunStatus."""

from __future__ import annotations

import asyncio
import logging
import signal
import time
import traceback
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from chaoskit.engine import watchdog
from chaoskit.engine.hypothesis import Sample, take_sample
from chaoskit.engine.journal import Journal
from chaoskit.engine.ledger import Entry, Ledger, LedgerLockTimeout
from chaoskit.engine.rollback import revert_entry, rollback
from chaoskit.engine.states import FailureKind, RunStatus, State
from chaoskit.errors import PreflightError
from chaoskit.injectors import Injector, injector_class
from chaoskit.probes import Probe, probe_class
from chaoskit.spec.models import Experiment, Safeguard, Step
from chaoskit.targets.process import ProcessRef, is_alive

log = logging.getLogger(__name__)

APPLY_GRACE_S = 10.0  # how long rollback waits for an apply that outlived its timeout or a cancel
WATCHDOG_CHECK_S = 0.5
OBSERVE_TIMEOUT_S = 10.0
LATE_APPLY_S = 30.0  # after the rollback, how long to wait for such an apply to land so it can be reverted


@dataclass
class RunOptions:
    dry_run: bool = False
    ledger_dir: Path | None = None
    use_watchdog: bool = True


@dataclass
class RunResult:
    run_id: str
    status: RunStatus
    samples: list[Sample] = field(default_factory=list)
    faults: list[dict[str, Any]] = field(default_factory=list)
    plan: list[dict[str, Any]] = field(default_factory=list)
    recovery_s: float | None = None
    ledger_path: str | None = None
    started: float = 0.0
    ended: float = 0.0

    @property
    def exit_code(self) -> int:
        return self.status.exit_code()


def new_run_id(name: str) -> str:
    return time.strftime("%Y%m%dT%H%M%S") + f"-{name}-{uuid.uuid4().hex[:6]}"


def _inject_steps(steps: list[Step]) -> list[Step]:
    out: list[Step] = []
    for s in steps:
        if s.inject is not None:
            out.append(s)
        elif s.parallel:
            out.extend(_inject_steps(s.parallel))
    return out


class Runner:
    def __init__(self, experiment: Experiment, journal: Journal, options: RunOptions | None = None,
                 run_id: str | None = None):
        self.exp = experiment
        self.journal = journal
        self.opts = options or RunOptions()
        self.status = RunStatus(on_change=self._on_state)
        self.result = RunResult(run_id or new_run_id(experiment.metadata.name), self.status)
        self.probes: dict[str, Probe] = {}
        self.safeguard_probes: list[tuple[Safeguard, Probe]] = []
        self.injectors: dict[int, Injector] = {}  # id(step) -> injector
        self.ledger: Ledger | None = None
        self._method_task: asyncio.Task | None = None
        self._inflight: dict[asyncio.Future, int] = {}  # applies still running in their thread -> entry id
        self._faults: dict[int, dict[str, Any]] = {}
        self._records: dict[int, dict[str, Any]] = {}  # final revert records of applied faults
        self._watchdog: ProcessRef | None = None
        self._in_effect: asyncio.Event | None = None  # set once the method's first fault is applied
        self._active = 0  # faults in effect now: "during" samples are judged only while one is
        self._sampling = False  # samplers loop while this holds, so a cancel a probe swallows still stops them

    # -- events -------------------------------------------------------------------------------------
    def _on_state(self, old: State, new: State, reason: str) -> None:
        self.journal.emit("state", state=new.value, previous=old.value, reason=reason)

    def _record(self, sample: Sample) -> None:
        self.result.samples.append(sample)
        self.journal.emit("sample", **sample.to_json())

    # -- signals --------------------------------------------------------------------------------------
    def interrupt(self, signum: int) -> None:
        """SIGINT/SIGTERM: stop the method; rollback still runs in full."""
        first = self.status.signal is None
        self.status.interrupt(signum)
        if first:
            self.journal.emit("interrupt", signal=signal.Signals(signum).name)
        if self._method_task is not None and not self._method_task.done():
            self._method_task.cancel()

    # -- phases ---------------------------------------------------------------------------------------
    async def execute(self) -> RunResult:
        r = self.result
        r.started = time.time()
        self.journal.emit("run", run_id=r.run_id, experiment=self.exp.metadata.name, dry_run=self.opts.dry_run)
        try:
            await self._execute()
        except Exception as e:  # an engine bug: still roll back, then fail loudly
            self.journal.emit("error", where="engine", error=f"{type(e).__name__}: {e}",
                              traceback=traceback.format_exc())
            self.status.fail(FailureKind.INTERNAL, f"internal error: {type(e).__name__}: {e}")
            if self.status.state in (State.HYPOTHESIS_BEFORE, State.METHOD):
                self.status.to(State.ROLLBACK)
            if self.status.state is State.ROLLBACK:
                await self._rollback()
            if not self.status.terminal:
                self.status.to(State.FAILED, self.status.reason)
        finally:
            for p in [*self.probes.values(), *(p for _, p in self.safeguard_probes)]:
                try:
                    await p.close()
                except Exception:
                    pass
        r.ended = time.time()
        r.faults = list(self._faults.values())
        self.journal.emit("end", verdict=self.status.verdict, exit_code=self.status.exit_code(),
                          reason=self.status.reason, deviations=self.status.deviations,
                          recovery_s=r.recovery_s)
        return r

    def _stopped(self) -> bool:
        return self.status.signal is not None

    async def _execute(self) -> None:
        st = self.status
        st.to(State.VALIDATING)
        st.to(State.PREFLIGHT)
        try:
            self._preflight()
        except PreflightError as e:
            st.fail(FailureKind.PREFLIGHT, str(e))
            st.to(State.FAILED, str(e))
            return
        if self.opts.dry_run:
            st.dry_run = True
            st.to(State.DONE, "dry run: nothing applied")
            return
        if self._stopped():
            st.to(State.INTERRUPTED, "interrupted before anything was applied")
            return
        st.to(State.HYPOTHESIS_BEFORE)
        held = bool(await self._cancellable(self._check_once("before")))
        if self._stopped() or not held:
            if not held and not self._stopped():
                st.deviate("steady state did not hold before the method; nothing was injected")
            st.to(State.ROLLBACK)
            self._finish_after_rollback(skip_after=True)
            return
        self.ledger = Ledger.create(self.result.run_id, self.exp.metadata.name, self.opts.ledger_dir)
        self.result.ledger_path = str(self.ledger.path)
        if self.opts.use_watchdog and not await self._start_watchdog():
            st.to(State.ROLLBACK)
            await self._rollback()
            st.to(State.FAILED, st.reason)
            return
        st.to(State.METHOD)
        abort_reason = await self._method()
        st.to(State.ROLLBACK)
        await self._rollback()
        if abort_reason:
            st.to(State.ABORTED, abort_reason)
            return
        if st.failure is FailureKind.APPLY:
            st.to(State.FAILED, st.reason)
            return
        self._finish_after_rollback(skip_after=self._stopped())
        if st.state is State.HYPOTHESIS_AFTER:
            await self._after()

    async def _start_watchdog(self) -> bool:
        """Spawn the watchdog and wait for its handshake; False (run failed, nothing applied) if none answers."""
        assert self.ledger is not None
        try:
            ref, info = await asyncio.to_thread(watchdog.spawn, self.ledger)
        except watchdog.WatchdogError as e:
            self.status.fail(FailureKind.APPLY, f"no watchdog, so nothing was applied: {e}")
            return False
        self._watchdog = ref
        self.journal.emit("watchdog", pid=ref.pid, ledger=str(self.ledger.path), escaped_to=info["escaped_to"],
                          problems=info["problems"])
        return True

    async def _supervise_watchdog(self) -> None:
        """During the method: a watchdog that died (killed, OOM) is replaced, so faults stay covered."""
        assert self.ledger is not None
        while self._watchdog is not None:
            await asyncio.sleep(WATCHDOG_CHECK_S)
            if is_alive(self._watchdog):
                continue
            self.journal.emit("watchdog_died", pid=self._watchdog.pid)
            try:
                self._watchdog, info = await asyncio.to_thread(watchdog.spawn, self.ledger)
            except watchdog.WatchdogError as e:
                self.journal.emit("error", where="watchdog", error=str(e))
                continue
            self.journal.emit("watchdog", pid=self._watchdog.pid, ledger=str(self.ledger.path), respawned=True,
                              escaped_to=info["escaped_to"], problems=info["problems"])

    def _finish_after_rollback(self, skip_after: bool) -> None:
        if self._stopped():
            self.status.to(State.INTERRUPTED, "interrupted; everything applied was reverted")
        elif skip_after:
            self.status.to(State.DONE)
        else:
            self.status.to(State.HYPOTHESIS_AFTER)

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
        plan = []
        for step in _inject_steps(self.exp.method):
            inj = injector_class(step.inject.type)(step.inject)  # type: ignore[union-attr]
            if hasattr(inj, "max_lifetime_s"):
                inj.max_lifetime_s = step.lifetime()  # helper processes also expire by themselves
            self.injectors[id(step)] = inj
            try:
                inj.preflight()
            except PreflightError as e:
                problems.append(str(e))
            try:  # the plan is shown even when preflight failed (--dry-run prints it beside the reason)
                lines = inj.plan()
            except Exception as e:
                lines = [f"(no plan: {type(e).__name__}: {e})"]
            item = {"step": step.label(), "type": inj.type, "duration_s": step.duration, "changes": lines}
            plan.append(item)
        self.result.plan = plan
        self.journal.emit("plan", steps=plan)
        if problems:
            raise PreflightError("\n".join(problems))

    async def _check_once(self, phase: str) -> bool:
        probes = [p for p in self.probes.values() if phase in p.spec.phases]
        samples = await asyncio.gather(*(take_sample(p, phase) for p in probes))
        held = True
        for s in samples:
            self._record(s)
            if s.verdict != "ok":
                held = False
        return held

    # -- method ---------------------------------------------------------------------------------------
    async def _method(self) -> str | None:
        """Run the steps with continuous probing; return an abort reason if a safeguard tripped."""
        abort: list[str] = []
        self._in_effect = asyncio.Event()
        self._sampling = True
        samplers = self._start_samplers(abort)
        if self._watchdog is not None:
            samplers.append(asyncio.create_task(self._supervise_watchdog()))
        try:
            await self._cancellable(self._steps(self.exp.method))
        except _ApplyFailed as e:
            self.status.fail(FailureKind.APPLY, str(e))
        finally:
            self._sampling = False
            for t in samplers:
                t.cancel()
            await asyncio.gather(*samplers, return_exceptions=True)
        return abort[0] if abort else None

    async def _steps(self, steps: list[Step]) -> None:
        for step in steps:
            await self._step(step)

    async def _cancellable(self, coro: Any) -> Any:
        """Run `coro` as the task that interrupts and safeguards cancel; a cancel returns None."""
        self._method_task = asyncio.create_task(coro)
        if self._stopped():
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
        if not guards:  # "during" means while a fault is in effect; safeguards watch the applies too
            await self._in_effect.wait()
        start = time.monotonic()
        deviated = False
        while self._sampling:
            judging = judged and self._active > 0
            phase = "during" if judging else ("between" if judged else "safeguard")  # between: no fault in effect
            sample = await self._take_guarded(probe, phase, guards)
            if isinstance(sample, str):  # a latency safeguard tripped while the probe was still out
                self._trip(probe, sample, abort)
                return
            self._record(sample)
            if judging and sample.verdict != "ok" and not deviated:
                deviated = True  # the first deviation of each probe is the news; the journal has every sample
                self.status.deviate(f"{probe.spec.name} deviated during the method: "
                                    + (sample.error or "; ".join(d for d in sample.details)))
            for g in guards:
                reason = _tripped(g, sample)
                if reason:
                    self._trip(probe, reason, abort)
                    return
            # next slot on the fixed grid; slots missed by a slow sample are skipped, not bunched
            elapsed = time.monotonic() - start
            await asyncio.sleep((int(elapsed / every) + 1) * every - elapsed)

    def _trip(self, probe: Probe, reason: str, abort: list[str]) -> None:
        if not abort:
            abort.append(reason)
            self.journal.emit("safeguard", probe=probe.spec.name, reason=reason)
            if self._method_task is not None:
                self._method_task.cancel()

    @staticmethod
    async def _take_guarded(probe: Probe, phase: str, guards: list[Safeguard]) -> Sample | str:
        """A sample, or the trip reason of a safeguard latency rule (`latency_ms > 300`) whose threshold passed
        without an answer: the rule is decided then, not when the probe's timeout ends."""
        bound = _latency_bound(guards)
        task = asyncio.ensure_future(take_sample(probe, phase))
        try:
            if bound is not None:
                done, _ = await asyncio.wait({task}, timeout=bound[0])
                if not done:
                    return f"safeguard {probe.spec.name}: {bound[1]}: no answer after {bound[0] * 1000:g} ms"
            return await task
        finally:
            if not task.done():
                task.cancel()

    async def _step(self, step: Step) -> None:
        if step.pause is not None:
            self.journal.emit("pause", seconds=step.pause)
            await asyncio.sleep(step.pause)
        elif step.parallel:
            tasks = [asyncio.create_task(self._step(s)) for s in step.parallel]
            try:
                await asyncio.gather(*tasks)
            finally:
                for t in tasks:
                    t.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)
        else:
            await self._inject(step)

    async def _inject(self, step: Step) -> None:
        assert self.ledger is not None and step.inject is not None
        inj = self.injectors[id(step)]
        t0 = time.perf_counter()
        try:
            record = inj.prepare()
            entry_id = self.ledger.intent(inj.type, record, inj.plan(),
                                          expires_at=time.time() + step.timeout + step.lifetime())
        except Exception as e:
            raise _ApplyFailed(f"{step.label()}: could not prepare: {type(e).__name__}: {e}") from None
        fault = {"id": entry_id, "step": step.label(), "type": inj.type, "duration_s": step.duration,
                 "applied_at": None, "reverted_at": None, "apply_ms": None}
        self._faults[entry_id] = fault
        future = asyncio.ensure_future(asyncio.to_thread(inj.apply, record))
        self._inflight[future] = entry_id
        future.add_done_callback(lambda f: self._inflight.pop(f, None))
        try:
            async with asyncio.timeout(step.timeout):
                final = await asyncio.shield(future)
        except TimeoutError:
            raise _ApplyFailed(f"{step.label()}: apply timed out after {step.timeout:g}s") from None
        except asyncio.CancelledError:
            raise
        except Exception as e:
            self.journal.emit("error", where=f"apply {step.label()}", error=f"{type(e).__name__}: {e}")
            raise _ApplyFailed(f"{step.label()}: apply failed: {type(e).__name__}: {e}") from None
        self.ledger.applied(entry_id, final, expires_at=time.time() + step.lifetime())
        fault["applied_at"] = time.time()
        fault["apply_ms"] = round((time.perf_counter() - t0) * 1000, 3)
        self._records[entry_id] = final
        self.journal.emit("fault_applied", **fault)
        await self._observe(entry_id, "applied")
        self._active += 1
        if self._in_effect is not None:
            self._in_effect.set()
        if step.duration is None:
            return  # stays until the rollback phase
        await asyncio.sleep(step.duration)
        self._active -= 1  # from here on, samples see the revert, not the fault
        await self._observe(entry_id, "before_revert")
        entry = Entry(entry_id, inj.type, final, applied=True)
        error = await asyncio.to_thread(self._revert_one, entry)
        if error:
            raise _ApplyFailed(f"{step.label()}: revert at end of duration failed: {error}")

    async def _observe(self, entry_id: int, when: str) -> None:
        """Journal what the fault is doing (observe_details); an error here is journaled, never raised."""
        fault, record = self._faults[entry_id], self._records[entry_id]
        try:
            async with asyncio.timeout(OBSERVE_TIMEOUT_S):  # the thread may go on; the run does not wait for it
                details = await asyncio.to_thread(injector_class(fault["type"]).observe_details, record)
        except Exception as e:
            details = {"error": f"{type(e).__name__}: {e}"}
        fault[f"observed_{when}"] = details
        self.journal.emit("fault_observed", id=entry_id, type=fault["type"], when=when, details=details)

    def _revert_one(self, entry: Entry) -> str | None:
        assert self.ledger is not None
        try:
            with self.ledger.locked():
                if self.ledger.read().entries[entry.id].reverted:
                    return None
                error = revert_entry(self.ledger, entry)
        except LedgerLockTimeout as e:
            error = str(e)
        self._note_revert(entry, error)
        return error

    def _note_revert(self, entry: Entry, error: str | None) -> None:
        fault = self._faults.get(entry.id)
        if fault is not None and error is None:
            fault["reverted_at"] = time.time()
        self.journal.emit("fault_reverted" if error is None else "revert_failed", id=entry.id, type=entry.type,
                          error=error)

    # -- rollback and after ---------------------------------------------------------------------------
    async def _rollback(self) -> None:
        if self.ledger is None:
            return
        if self._inflight:  # an apply still running in its thread: let it land, then revert it too
            await asyncio.wait(list(self._inflight), timeout=APPLY_GRACE_S)
        for entry_id in self._records:
            if self._faults[entry_id]["reverted_at"] is None:
                await self._observe(entry_id, "before_revert")
        t0 = time.perf_counter()
        late = dict(self._inflight)  # still running after the grace: reverted from the intent now, and again below
        result = await asyncio.to_thread(rollback, self.ledger, False, self._note_revert)
        failed = [f"#{e.id} {e.type}: {err}" for e, err in result.failed] + await self._revert_late(late)
        self.journal.emit("rollback", reverted=len(result.reverted), failed=len(failed),
                          ms=round((time.perf_counter() - t0) * 1000, 3), ledger=str(self.ledger.path))
        if not failed:
            self.ledger.close()
            self.ledger.remove_lockfile()
            self.ledger.discard()
        else:
            self.status.rollback_incomplete = True
            self.status.reason = "; ".join(failed)

    async def _revert_late(self, late: dict[asyncio.Future, int]) -> list[str]:
        """An apply that outlived its timeout and the grace may still land after the rollback: wait for it and
        revert what it did (from its final record); one that never finishes is a rollback failure (loud)."""
        if not late:
            return []
        assert self.ledger is not None
        self.journal.emit("late_apply_wait", ids=sorted(late.values()), seconds=LATE_APPLY_S)
        done, pending = await asyncio.wait(list(late), timeout=LATE_APPLY_S)
        failed = [f"#{late[f]} {self._faults[late[f]]['type']}: apply still running {APPLY_GRACE_S + LATE_APPLY_S:g}s "
                  "after its timeout; it may still land" for f in pending]
        for f in done:
            entry_id = late[f]
            record = f.result() if not f.cancelled() and f.exception() is None else None
            entry = Entry(entry_id, self._faults[entry_id]["type"],
                          record or self.ledger.read().entries[entry_id].record, applied=True)
            error = await asyncio.to_thread(revert_entry, self.ledger, entry)
            self.journal.emit("late_apply_reverted", id=entry_id, type=entry.type, error=error)
            if error:
                failed.append(f"#{entry_id} {entry.type}: late apply: {error}")
        return failed

    async def _after(self) -> None:
        after = self.exp.steady_state.after
        start = time.monotonic()
        while True:
            if await self._check_once("after"):
                self.result.recovery_s = round(time.monotonic() - start, 3)
                self.journal.emit("recovered", seconds=self.result.recovery_s)
                break
            if self._stopped():
                break
            if time.monotonic() - start >= after.within:
                self.status.deviate(f"steady state did not hold again within {after.within:g}s after rollback")
                break
            await asyncio.sleep(after.every)
        if self._stopped():
            self.status.to(State.INTERRUPTED, "interrupted; everything applied was reverted")
        else:
            self.status.to(State.DONE)


class _ApplyFailed(Exception):
    pass


LATENCY_METRICS = ("latency_ms", "duration_ms")  # what a probe answer's own lateness already decides


def _latency_bound(guards: list[Safeguard]) -> tuple[float, str] | None:
    """(seconds, rule) of the tightest `latency_ms > X` / `duration_ms >= X` rule among the safeguards."""
    bounds = [(rule.tolerance.value / 1000, str(rule)) for g in guards for rule in g.rules()
              if rule.metric in LATENCY_METRICS and rule.tolerance.kind == "cmp" and rule.tolerance.op in (">", ">=")
              and isinstance(rule.tolerance.value, float)]
    return min(bounds) if bounds else None


def _tripped(guard: Safeguard, sample: Sample) -> str | None:
    if sample.verdict == "error":
        return f"{sample.probe}: probe error ({sample.error})" if guard.on_error == "abort" else None
    for rule in guard.rules():
        ok, why = rule.matches(sample.values)
        if ok:
            return f"safeguard {sample.probe}: {why}"
    return None
