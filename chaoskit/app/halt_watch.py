"""A run that obeys the halt levers: looked at every safeguard interval, a pulled one aborts and rolls it back."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from chaoskit.app.halt import Levers
from chaoskit.engine.runner import Runner
from chaoskit.executors.k8s_halt import HaltLever
from chaoskit.model.events import SafeguardTripped

log = logging.getLogger(__name__)


class HaltableRunner(Runner):
    """A Runner that a halt lever stops: the state machine records the halt (RunStatus.halt), the method is
    cancelled like a tripped safeguard's, everything applied is rolled back, and the run ends aborted (exit 3)."""

    def halt(self, lever: HaltLever) -> None:
        reason = f"halted: {lever.reason}"
        if self.status.terminal or not self.status.halt(reason):
            return
        self.journal.emit(SafeguardTripped(probe="halt", reason=f"{reason} (pulled {lever.describe()})"))
        if self._method_task is not None and not self._method_task.done():
            self._method_task.cancel()

    def _stopped(self) -> bool:
        return self.status.stopped


async def watch(runner: HaltableRunner, levers: Levers, every: float, note: Callable[[str], None]) -> None:
    """Look at the levers every `every` seconds until the run ends; halt it at the first pulled one."""
    while not runner.status.terminal:
        try:
            lever = await asyncio.to_thread(levers.check, note)
        except Exception as e:  # never let a bad look end the watch: the next one may succeed
            log.warning("looking at the halt levers: %s: %s", type(e).__name__, e)
            lever = None
        if lever is not None:
            runner.halt(lever)
            return
        await asyncio.sleep(every)
