"""The faults of one run: ledgered applies with a timeout, what they do (observe), the revert at the end of a
duration, the full rollback (late applies included), and the watchdog that covers them all."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

from chaoskit.engine import watchdog
from chaoskit.engine.journal import Journal
from chaoskit.engine.ledger import Entry, Ledger, LedgerLockTimeout
from chaoskit.engine.rollback import revert_entry, rollback
from chaoskit.engine.target_exits import ExitWatch
from chaoskit.executors import Placement, get_executor, route_of
from chaoskit.executors.layer import place
from chaoskit.experiment.models import Step
from chaoskit.injectors import Injector
from chaoskit.model.events import (
    ErrorNoted,
    FaultObserved,
    FaultReverted,
    LateApplyReverted,
    LateApplyWait,
    RevertFailed,
    RolledBack,
    TargetExited,
    WatchdogDied,
    WatchdogStarted,
)
from chaoskit.model.faults import AppliedFault
from chaoskit.targets.process import ProcessRef, is_alive

APPLY_GRACE_S = 10.0  # how long rollback waits for an apply that outlived its timeout or a cancel
LATE_APPLY_S = 30.0  # after the rollback, how long to wait for such an apply to land so it can be reverted
WATCHDOG_CHECK_S = 0.5
TARGET_CHECK_S = 0.5  # how often the target processes of the faults in effect are checked for exits
OBSERVE_TIMEOUT_S = 10.0


class FaultFailed(Exception):
    """A fault could not be prepared, applied or reverted at the end of its duration (the run fails)."""


class Faults:
    def __init__(self, journal: Journal, ledger: Ledger, may_exit: bool = False,
                 on_exit: Callable[[TargetExited], None] | None = None):
        self.journal, self.ledger = journal, ledger
        self.may_exit = may_exit  # the experiment declared that its targets may exit (target.may_exit)
        self.on_exit = on_exit  # told of each target exit (the runner's state machine decides what it means)
        self.faults: dict[int, AppliedFault] = {}  # entry id -> what the summary reports
        self._records: dict[int, dict[str, Any]] = {}  # final revert records of applied faults
        self._routes: dict[int, tuple[str, Placement]] = {}  # entry id -> (executor name, placement)
        self._inflight: dict[asyncio.Future, int] = {}  # applies still running in their thread -> entry id
        self._watchdog: ProcessRef | None = None
        self._exits = ExitWatch()  # the target processes of the faults applied, until the after phase ends
        self.ended: set[tuple[int, int]] = set()  # (pid, start time) of the processes a fault of the run ends itself

    # -- the watchdog ---------------------------------------------------------------------------------
    async def start_watchdog(self) -> str | None:
        """Spawn it and wait for its handshake; the reason to fail the run (nothing applied) if none answers."""
        try:
            ref, info = await asyncio.to_thread(watchdog.spawn, self.ledger)
        except watchdog.WatchdogError as e:
            return f"no watchdog, so nothing was applied: {e}"
        self._watchdog = ref
        self.journal.emit(WatchdogStarted(pid=ref.pid, ledger=str(self.ledger.path), escaped_to=info["escaped_to"],
                                          problems=info["problems"]))
        return None

    async def supervise_watchdog(self) -> None:
        """During the method: a watchdog that died (killed, OOM) is replaced, so faults stay covered."""
        while self._watchdog is not None:
            await asyncio.sleep(WATCHDOG_CHECK_S)
            if is_alive(self._watchdog):
                continue
            self.journal.emit(WatchdogDied(pid=self._watchdog.pid))
            try:
                self._watchdog, info = await asyncio.to_thread(watchdog.spawn, self.ledger)
            except watchdog.WatchdogError as e:
                self.journal.emit(ErrorNoted(where="watchdog", error=str(e)))
                continue
            self.journal.emit(WatchdogStarted(pid=self._watchdog.pid, ledger=str(self.ledger.path), respawned=True,
                                              escaped_to=info["escaped_to"], problems=info["problems"]))

    # -- their targets ----------------------------------------------------------------------------------
    async def supervise_targets(self) -> None:
        """From the method's start to the end of the after phase: a target process of a fault applied (or its
        service) that exits (killed, crashed, OOM-killed, aborted on its revert) is journaled when it is seen
        gone, once; end() and rollback() check once more before and after reverting."""
        while True:
            await asyncio.sleep(TARGET_CHECK_S)
            self.check_targets()

    def check_targets(self) -> list[TargetExited]:
        """Journal (and tell on_exit of) the watched processes that exited since the last check."""
        exits = self._exits.check()
        self._note_exits(exits)
        return exits

    def _watch_targets(self, entry_id: int, step: Step, inj: Injector, executor: str, final: dict[str, Any]) -> None:
        """Watch what the fault acts on here (a fault run on another node has no processes here to watch)."""
        if executor != "local":
            return
        try:
            refs = inj.watched_processes(type(inj).from_ledger(final))
        except Exception as e:  # a report, not the fault: never fails the run
            self.journal.emit(ErrorNoted(where=f"watch targets of {step.label()}", error=f"{type(e).__name__}: {e}"))
            return
        self._exits.watch(entry_id, step.label(), inj.type, refs)

    def _note_exits(self, exits: list[TargetExited]) -> None:
        for e in exits:
            e = e.model_copy(update={"expected": self.may_exit or (e.pid, e.start_time) in self.ended})
            self.faults[e.id].exits.append(e)
            self.journal.emit(e)
            if self.on_exit is not None:
                self.on_exit(e)

    # -- one fault --------------------------------------------------------------------------------------
    async def apply(self, step: Step, inj: Injector, group: str | None = None) -> int:
        """Intent in the ledger (fsync'd), apply within the step's timeout, applied in the ledger; the entry id.
        `group` names the `parallel` block the step is in."""
        t0 = time.perf_counter()
        try:
            # resolved again now: a process or pod an earlier step killed has been replaced
            await asyncio.to_thread(place, inj)
            executor_name, placement = route_of(inj)
            executor = get_executor(executor_name)
            record = executor.prepare(inj)
            if executor_name == "local":  # known before the apply, so an exit it causes is never seen unexplained
                self.ended.update((r.pid, r.start_time) for r in inj.ended_processes(type(inj).from_ledger(record)))
            entry_id = await asyncio.to_thread(  # its fsync off the loop: a parallel step's overlap
                self.ledger.intent, inj.type, record, executor.plan(inj),
                expires_at=time.time() + step.timeout + step.lifetime(), executor=executor_name,
                placement=placement, group=group)
        except Exception as e:
            raise FaultFailed(f"{step.label()}: could not prepare: {type(e).__name__}: {e}") from None
        fault = AppliedFault(entry_id, step.label(), inj.type, step.duration)
        self.faults[entry_id] = fault
        self._routes[entry_id] = (executor_name, placement)
        future = asyncio.ensure_future(asyncio.to_thread(executor.apply, inj, record, placement))
        self._inflight[future] = entry_id
        future.add_done_callback(lambda f: self._inflight.pop(f, None))
        try:
            async with asyncio.timeout(step.timeout):
                final = await asyncio.shield(future)
        except TimeoutError:
            raise FaultFailed(f"{step.label()}: apply timed out after {step.timeout:g}s") from None
        except asyncio.CancelledError:
            raise
        except Exception as e:
            self.journal.emit(ErrorNoted(where=f"apply {step.label()}", error=f"{type(e).__name__}: {e}"))
            raise FaultFailed(f"{step.label()}: apply failed: {type(e).__name__}: {e}") from None
        self._records[entry_id] = final  # known before the next await: a cancel from here on reverts it as applied
        fault.applied_at = time.time()
        fault.apply_ms = round((time.perf_counter() - t0) * 1000, 3)
        await asyncio.shield(asyncio.to_thread(self.ledger.applied, entry_id, final,
                                               expires_at=time.time() + step.lifetime()))
        self.journal.emit(fault.applied_event(executor_name, placement))  # the chosen pods, nodes ... too
        self._watch_targets(entry_id, step, inj, executor_name, final)
        await self.observe(entry_id, "applied")
        return entry_id

    async def end(self, entry_id: int, label: str) -> None:
        """The end of a fault's duration: observe, then revert it (FaultFailed if that fails)."""
        self._note_exits(self._exits.check(entry_id))
        await self.observe(entry_id, "before_revert")
        self._exits.stage(entry_id, "at_revert")
        entry = self._entry(entry_id, self._records[entry_id])
        error = await asyncio.to_thread(self._revert_one, entry)
        self._note_exits(self._exits.check(entry_id))
        self._exits.stage(entry_id, "after")
        if error:
            raise FaultFailed(f"{label}: revert at end of duration failed: {error}")

    async def observe(self, entry_id: int, when: str) -> None:
        """Journal what the fault is doing (observe_details); an error here is journaled, never raised."""
        fault, record = self.faults[entry_id], self._records[entry_id]
        try:
            async with asyncio.timeout(OBSERVE_TIMEOUT_S):  # the thread may go on; the run does not wait for it
                name, placement = self._routes[entry_id]
                details = await asyncio.to_thread(get_executor(name).observe_details, fault.type, record,
                                                  placement)
        except Exception as e:
            details = {"error": f"{type(e).__name__}: {e}"}
        fault.observed[when] = details
        self.journal.emit(FaultObserved(id=entry_id, type=fault.type, when=when, details=details))

    def _entry(self, entry_id: int, record: dict[str, Any]) -> Entry:
        name, placement = self._routes[entry_id]
        return Entry(entry_id, self.faults[entry_id].type, record, applied=True, executor=name,
                     placement=placement)

    def _revert_one(self, entry: Entry) -> str | None:
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
        fault = self.faults.get(entry.id)
        if fault is not None and error is None:
            fault.reverted_at = time.time()
        elif fault is not None:
            fault.revert_error = error
        self.journal.emit(FaultReverted(id=entry.id, type=entry.type) if error is None
                          else RevertFailed(id=entry.id, type=entry.type, error=error))

    # -- all of them ------------------------------------------------------------------------------------
    async def rollback(self) -> list[str]:
        """Revert everything the ledger holds, newest first; the failures (empty: the ledger is discarded)."""
        if self._inflight:  # an apply still running in its thread: let it land, then revert it too
            await asyncio.wait(list(self._inflight), timeout=APPLY_GRACE_S)
        live = [entry_id for entry_id in self._records if self.faults[entry_id].reverted_at is None]
        for entry_id in live:
            self._note_exits(self._exits.check(entry_id))
        await asyncio.gather(*(self.observe(entry_id, "before_revert") for entry_id in live))  # read-only: at once
        for entry_id in live:
            self._exits.stage(entry_id, "at_revert")
        t0 = time.perf_counter()
        late = dict(self._inflight)  # still running after the grace: reverted from the intent now, and again below
        result = await asyncio.to_thread(rollback, self.ledger, False, self._note_revert)
        failed = [f"#{e.id} {e.type}: {err}" for e, err in result.failed] + await self._revert_late(late)
        for entry_id in live:
            self._note_exits(self._exits.check(entry_id))
            self._exits.stage(entry_id, "after")
        self.journal.emit(RolledBack(reverted=len(result.reverted), failed=len(failed),
                                     ms=round((time.perf_counter() - t0) * 1000, 3), ledger=str(self.ledger.path)))
        if not failed:
            self.ledger.close()
            self.ledger.remove_lockfile()
            self.ledger.discard()
        return failed

    async def _revert_late(self, late: dict[asyncio.Future, int]) -> list[str]:
        """An apply that outlived its timeout and the grace may still land after the rollback: wait for it and
        revert what it did (from its final record); one that never finishes is a rollback failure (loud)."""
        if not late:
            return []
        self.journal.emit(LateApplyWait(ids=sorted(late.values()), seconds=LATE_APPLY_S))
        done, pending = await asyncio.wait(list(late), timeout=LATE_APPLY_S)
        failed = [f"#{late[f]} {self.faults[late[f]].type}: apply still running {APPLY_GRACE_S + LATE_APPLY_S:g}s "
                  "after its timeout; it may still land" for f in pending]
        for f in done:
            entry_id = late[f]
            record = f.result() if not f.cancelled() and f.exception() is None else None
            entry = self._entry(entry_id, record or self.ledger.read().entries[entry_id].record)
            error = await asyncio.to_thread(revert_entry, self.ledger, entry)
            self.journal.emit(LateApplyReverted(id=entry_id, type=entry.type, error=error))
            if error:
                failed.append(f"#{entry_id} {entry.type}: late apply: {error}")
        return failed
