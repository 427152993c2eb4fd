"""`chaoskit run --step` for game days: before each method step, show what the step will change (its plan)
and ask the operator to continue, skip the step, or abort (everything applied is rolled back, exit 3). The
answer is read by the event loop watching the terminal, not by a thread, so Ctrl-C, a tripped safeguard or
the end of the run cancel the question cleanly."""

from __future__ import annotations

import asyncio
import os
import sys
import termios
from contextlib import AbstractContextManager, nullcontext
from typing import Protocol

from rich.console import Console

from chaoskit.engine.journal import Journal
from chaoskit.experiment.models import Step
from chaoskit.model.events import OperatorChose, PlanStep

CHOICES = {"": "continue", "c": "continue", "continue": "continue", "s": "skip", "skip": "skip",
           "a": "abort", "abort": "abort"}
PROMPT = "[c]ontinue (Enter) / [s]kip this step / [a]bort: roll back everything and stop > "


class Pausable(Protocol):
    """The run's view (ui.View): it stops redrawing while the operator reads and answers."""

    def paused(self) -> AbstractContextManager[None]: ...


class Stepper:
    """The RunOptions.before_step hook: asks on `console`, reads `fd` (the terminal), journals the answer."""

    def __init__(self, console: Console, journal: Journal, view: Pausable | None = None, fd: int | None = None):
        self.console, self.journal, self.view = console, journal, view
        self.fd = sys.stdin.fileno() if fd is None else fd
        self.asked = 0

    async def __call__(self, step: Step, plans: list[PlanStep]) -> str:
        self.asked += 1
        with self.view.paused() if self.view is not None else nullcontext():
            self._show(step, plans)
            choice = await self._ask()
        self.journal.emit(OperatorChose(step=step.label(), choice=choice))
        return choice

    def _show(self, step: Step, plans: list[PlanStep]) -> None:
        say = self.console.print
        dur = f" for {step.duration:g}s" if step.duration else (" until the end of the method" if step.inject
                                                               else "")
        kind = step.inject.type if step.inject is not None else f"{len(plans)} faults at once"
        say(f"\nnext step {self.asked}: {step.label()} ({kind}{dur}) will change:", markup=False, highlight=False)
        for p in plans:
            lead = f"  {p.step}: " if len(plans) > 1 else "  "
            for change in p.changes or ["(no plan)"]:
                say(f"{lead}{change}", markup=False, highlight=False, soft_wrap=True)
                lead = " " * len(lead)

    async def _ask(self) -> str:
        try:
            termios.tcflush(self.fd, termios.TCIFLUSH)  # keys pressed before the question do not answer it
        except (termios.error, OSError):
            pass
        while True:
            self.console.print(PROMPT, end="", markup=False, highlight=False)
            line = await self._line()
            if line is None:  # end of input: nobody is there to say continue
                self.console.print("(end of input: abort)", markup=False)
                return "abort"
            choice = CHOICES.get(line.strip().lower())
            if choice is not None:
                return choice
            self.console.print(f"not an answer: {line.strip()!r}", markup=False, highlight=False)

    async def _line(self) -> str | None:
        """One line from the terminal (None at end of input), without blocking the event loop."""
        loop = asyncio.get_running_loop()
        done: asyncio.Future[str | None] = loop.create_future()
        buf = bytearray()

        def readable() -> None:
            try:
                chunk = os.read(self.fd, 1024)
            except BlockingIOError:
                return
            except OSError:
                chunk = b""
            if done.done():
                return
            if not chunk:
                done.set_result(None)
                return
            buf.extend(chunk)
            if b"\n" in buf or b"\r" in buf:
                done.set_result(bytes(buf).splitlines()[0].decode(errors="replace") if buf.strip() else "")

        loop.add_reader(self.fd, readable)
        try:
            return await done
        finally:
            loop.remove_reader(self.fd)
