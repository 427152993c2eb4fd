"""How `chaoskit run` shows progress: a live rich view on a TTY, plain timestamped lines otherwise (CI)."""

from __future__ import annotations

import math
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import Any

from rich.console import Console, Group
from rich.live import Live
from rich.table import Table
from rich.text import Text

from chaoskit.model.events import (
    HIDDEN,
    Event,
    FaultApplied,
    FaultReverted,
    Judgement,
    Planned,
    RevertFailed,
    RunEnded,
    SafeguardRecord,
    Sample,
    StateChanged,
    TargetExited,
)
from chaoskit.model.faults import AppliedFault
from chaoskit.report.charts import sparkline
from chaoskit.report.view import RunView

HISTORY = 30  # samples per probe the live view keeps
VERDICT_STYLE = {"ok": "green", "fail": "red", "error": "magenta"}
LIVE_NOTES = ("safeguard", "interrupt", "revert_failed", "error", "operator")
ALL_REQUESTS = "all_p99_ms"  # the slo probe's p99 over every request (failures at their timeout): always followed


def _values(sample: Sample) -> str:
    return sample.why() or ", ".join(f"{k}={v}" for k, v in list(sample.values.items())[:4])


class View(ABC):
    """How a run is shown: called with each event as it is journaled."""

    @abstractmethod
    def __call__(self, ev: Event) -> None: ...

    def paused(self) -> AbstractContextManager[None]:
        """Stop redrawing while someone types below it (--step's question); a view that only prints does nothing."""
        return nullcontext()


class PlainView(View):
    """One line per event; what CI logs want. Its stamps are in time order."""

    def __init__(self, console: Console):
        self.console = console
        self._last = 0.0  # the latest stamp printed

    def __call__(self, ev: Event) -> None:
        # a sample's `t` is when it started; the line is printed (and stamped) when its verdict is known, so the
        # log never goes back in time; the journal keeps the start. Samples taken together (the before and after
        # checks) arrive together when the slowest answers, in probe order: one that answered earlier is stamped
        # when its line is printed, not before the line above it
        t = ev.t + ev.duration_ms / 1000 if isinstance(ev, Sample) else ev.t
        self._last = max(self._last, t)
        ts = time.strftime("%H:%M:%S", time.localtime(self._last))
        self.console.print(f"{ts} {_line(ev)}", markup=False, highlight=False, soft_wrap=True)


def _line(ev: Event) -> str:
    if isinstance(ev, StateChanged):
        return f"state {ev.state}" + (f": {ev.reason}" if ev.reason else "")
    if isinstance(ev, Sample):
        return f"probe {ev.probe} [{ev.phase}] {ev.verdict} after {ev.duration_ms:.0f} ms: {_values(ev)}"
    if isinstance(ev, FaultApplied):
        dur = f" for {ev.duration_s:g}s" if ev.duration_s else " until rollback"
        return f"fault #{ev.id} {ev.type} applied{dur} ({ev.apply_ms or 0:.1f} ms)"
    if isinstance(ev, FaultReverted):
        return f"fault #{ev.id} {ev.type} reverted"
    if isinstance(ev, RevertFailed):
        return f"fault #{ev.id} {ev.type} REVERT FAILED: {ev.error}"
    if isinstance(ev, TargetExited):
        return _exit_line(ev)
    if isinstance(ev, Planned):
        return "plan: " + " | ".join(f"{p.step}: {'; '.join(p.changes)}" for p in ev.steps)
    if isinstance(ev, RunEnded):
        return f"verdict {ev.verdict} (exit {ev.exit_code})"
    return ev.event + " " + " ".join(f"{k}={v}" for k, v in ev.fields().items() if k not in HIDDEN)


class LiveView(View):
    """A rendering of the run's RunView as events arrive: phase; each probe's recent history (a sparkline of the
    value its tolerances judge, and of the all-requests p99 where the probe measures one, failed samples per
    phase, the last value); safeguards and whether one tripped; active faults with time left."""

    def __init__(self, console: Console, name: str, watch: dict[str, list[str]] | None = None,
                 safeguards: list[SafeguardRecord] | None = None):
        self.console, self.name = console, name
        self.watch = watch or {}  # probe -> the keys its tolerances judge (the sparkline follows the first number)
        self.safeguards = safeguards or []
        self.view = RunView(keep=HISTORY)
        self._lock = threading.Lock()  # events arrive from the loop and from revert threads; Rich renders in its own
        self.live = Live(self._render(), console=console, refresh_per_second=4, transient=False,
                         get_renderable=self._render)

    def __enter__(self) -> LiveView:
        self.live.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self.live.__exit__(*exc)

    @contextmanager
    def paused(self) -> Iterator[None]:
        """Stop redrawing (the last frame stays on screen) while someone types below it: --step's question."""
        self.live.stop()
        try:
            yield
        finally:
            self.live.vertical_overflow = "ellipsis"  # stop() let the last frame overflow; live frames do not
            self.live.start()

    def __call__(self, ev: Event) -> None:
        with self._lock:
            self.view.add(ev)

    def history(self, probe: str) -> list[Sample]:
        return [s for s in self.view.samples if s.probe == probe]

    def notes(self) -> list[str]:
        """What the run said that needs attention (and its recovery), oldest first."""
        notes = [(t, f"{kind}: {text}") for t, kind, text in self.view.notes if kind in LIVE_NOTES]
        if self.view.recovered_at is not None:
            notes.append((self.view.recovered_at, f"recovered: seconds={self.view.recovery_s}"))
        return [text for _, text in sorted(notes, key=lambda n: n[0])]

    def exited(self) -> list[str]:
        return [_exit_line(e) for e in sorted((e for f in self.view.faults for e in f.exits), key=lambda e: e.seen_at)]

    def _key(self, probe: str) -> str | None:
        """The value the sparkline follows: the first judged key that is a number, else the all-requests p99,
        else the first number."""
        for s in reversed(self.history(probe)):
            for k in [*self.watch.get(probe, []), ALL_REQUESTS, *s.values]:
                if _num(s.values.get(k)) is not None:
                    return k
        return None

    def _render(self) -> Group:
        with self._lock:
            return self._render_locked()

    def _render_locked(self) -> Group:
        v = self.view
        head = Text.assemble(("chaoskit ", "bold"), (self.name, "bold cyan"), "  phase: ", (v.state, "yellow"))
        parts: list[Any] = [head, self._probes()]
        if self.safeguards:
            parts.append(self._guards())
        faults = Table(title="active faults", expand=True, title_justify="left")
        for col in ("#", "type", "step", "time left"):
            faults.add_column(col)
        for f in v.active_faults():
            faults.add_row(str(f.id), f.type, f.step, _left(f))
        parts.append(faults)
        parts += [Text(e, style="bold yellow") for e in self.exited()[-5:]]
        return Group(*parts, *(Text(n, style="bold red") for n in self.notes()[-5:]))

    def _probes(self) -> Table:
        probes = Table(title="probes", expand=True, title_justify="left")
        for col in ("probe", "phase", "verdict", "history", "failed / samples", "last value"):
            probes.add_column(col)
        for name, phases in self.view.counts.items():
            history = self.history(name)
            s, key = history[-1], self._key(name)
            keys = [key] if key is not None else []
            if key != ALL_REQUESTS and any(ALL_REQUESTS in h.values for h in history):
                keys.append(ALL_REQUESTS)  # the all-requests p99 too, when the judged key is another
            trend = Text("\n").join(_trend(k, [_num(h.values.get(k)) for h in history], _judged(history, k))
                                    for k in keys)
            counts = Text()
            for phase, (n, bad) in phases.items():  # red: the engine's judgement of the phase failed
                outcome = self.view.phase_outcome(name, phase)
                style = "red" if outcome == "fail" else ("yellow" if bad else "green")
                counts.append(f"{phase} {bad}/{n} ", style=style)
            probes.add_row(name, s.phase, Text(s.verdict, style=VERDICT_STYLE.get(s.verdict, "")), trend,
                           counts, _values(s)[:100])
        return probes

    def _guards(self) -> Table:
        guards = Table(title="safeguards", expand=True, title_justify="left")
        for col in ("probe", "abort when", "state", "last"):
            guards.add_column(col)
        for g in self.safeguards:
            history = self.history(g.probe)
            last = history[-1] if history else None
            if g.probe in self.view.tripped:
                state = Text(f"TRIPPED: {self.view.tripped[g.probe]}", style="bold red")
            else:
                state = Text("watching", style="green") if last else Text("waiting for a sample", style="dim")
            shown = ", ".join(f"{r.metric}={last.values[r.metric]}" for r in g.rules
                              if r.metric in last.values) if last else ""
            guards.add_row(g.probe, " or ".join(r.text for r in g.rules), state,
                           shown or ((last.error or "") if last else ""))
        return guards


def _trend(key: str, values: list[float | None], judged: Judgement | None = None) -> Text:
    """`key ▁▂▇ last`: one history line of the live view, and how the engine judged the key last
    (`✗ < 3x baseline = 120`: the rule with the threshold it came to)."""
    last = next((x for x in reversed(values) if x is not None), None)
    verdict = ("", "") if judged is None else (f"  {'✓' if judged.ok else '✗'} {judged.bound()}",
                                               "green" if judged.ok else "red")
    return Text.assemble((key + " ", "dim"), sparkline(values, HISTORY), f" {last:g}" if last is not None else "",
                         verdict)


def _judged(history: list[Sample], key: str) -> Judgement | None:
    """The engine's latest judgement of `key` (None: it judges no such key)."""
    return next((j for s in reversed(history) if (j := s.judgement(key)) is not None), None)


def _left(f: AppliedFault) -> str:
    if not f.duration_s or f.applied_at is None:
        return "until rollback"
    return f"{max(0.0, f.applied_at + f.duration_s - time.time()):.1f}s"


def _exit_line(ev: TargetExited) -> str:
    """A target_exited event: `fault #1 process.signal (stop-stub): PID 29566 triton_python_backend_stub exited
    during the fault`."""
    step = f" ({ev.step})" if ev.step else ""
    return f"fault #{ev.id} {ev.type}{step}: {ev.text}"


def _num(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) else None
