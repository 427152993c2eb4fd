"""How `chaoskit run` shows progress: a live rich view on a TTY, plain timestamped lines otherwise (CI)."""

from __future__ import annotations

import math
import threading
import time
from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from rich.console import Console, Group
from rich.live import Live
from rich.table import Table
from rich.text import Text

from chaoskit.engine.charts import sparkline

HISTORY = 30  # samples per probe the live view keeps
VERDICT_STYLE = {"ok": "green", "fail": "red", "error": "magenta"}


def _values(sample: dict[str, Any]) -> str:
    if sample.get("error"):
        return sample["error"]
    return "; ".join(sample.get("details") or []) or ", ".join(
        f"{k}={v}" for k, v in list(sample.get("values", {}).items())[:4])


class PlainView:
    """One line per event; what CI logs want."""

    def __init__(self, console: Console):
        self.console = console

    def __call__(self, ev: dict[str, Any]) -> None:
        kind = ev["event"]
        # a sample's `t` is when it started; the line is printed (and stamped) when its verdict is known, so the
        # log never goes back in time; the journal keeps the start
        t = ev["t"] + ev.get("duration_ms", 0) / 1000 if kind == "sample" else ev["t"]
        ts = time.strftime("%H:%M:%S", time.localtime(t))
        if kind == "state":
            line = f"state {ev['state']}" + (f": {ev['reason']}" if ev.get("reason") else "")
        elif kind == "sample":
            line = (f"probe {ev['probe']} [{ev['phase']}] {ev['verdict']} after {ev.get('duration_ms', 0):.0f} ms: "
                    f"{_values(ev)}")
        elif kind == "fault_applied":
            dur = f" for {ev['duration_s']:g}s" if ev.get("duration_s") else " until rollback"
            line = f"fault #{ev['id']} {ev['type']} applied{dur} ({ev['apply_ms']:.1f} ms)"
        elif kind in ("fault_reverted", "revert_failed"):
            line = f"fault #{ev['id']} {ev['type']} " + ("reverted" if kind == "fault_reverted"
                                                         else f"REVERT FAILED: {ev['error']}")
        elif kind == "target_exited":
            line = _exit_line(ev)
        elif kind == "plan":
            line = "plan: " + " | ".join(f"{p['step']}: {'; '.join(p['changes'])}" for p in ev["steps"])
        elif kind == "end":
            line = f"verdict {ev['verdict']} (exit {ev['exit_code']})"
        else:
            line = kind + " " + " ".join(f"{k}={v}" for k, v in ev.items() if k not in ("t", "event", "traceback"))
        self.console.print(f"{ts} {line}", markup=False, highlight=False, soft_wrap=True)


class LiveView:
    """Phase; each probe's recent history (a sparkline of the value its tolerances judge, failed samples per
    phase, the last value); safeguards and whether one tripped; active faults with time left."""

    def __init__(self, console: Console, name: str, watch: dict[str, list[str]] | None = None,
                 safeguards: list[dict[str, Any]] | None = None):
        self.console, self.name = console, name
        self.watch = watch or {}  # probe -> the keys its tolerances judge (the sparkline follows the first number)
        self.safeguards = safeguards or []  # {"probe", "rules": [text], "metrics": [key]}
        self.state = "pending"
        self.samples: dict[str, dict[str, Any]] = {}
        self.history: dict[str, deque[dict[str, Any]]] = {}
        self.counts: dict[str, dict[str, list[int]]] = {}  # probe -> phase -> [samples, failed]
        self.tripped: dict[str, str] = {}  # probe -> why its safeguard tripped
        self.faults: dict[int, dict[str, Any]] = {}
        self.notes: list[str] = []
        self.exited: list[str] = []  # target processes that exited during their fault
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

    def __call__(self, ev: dict[str, Any]) -> None:
        with self._lock:
            self._update(ev)

    def _update(self, ev: dict[str, Any]) -> None:
        kind = ev["event"]
        if kind == "state":
            self.state = ev["state"]
        elif kind == "sample":
            probe = ev["probe"]
            self.samples[probe] = ev
            self.history.setdefault(probe, deque(maxlen=HISTORY)).append(ev)
            n_bad = self.counts.setdefault(probe, {}).setdefault(ev["phase"], [0, 0])
            n_bad[0] += 1
            n_bad[1] += ev["verdict"] != "ok"
        elif kind == "fault_applied":
            self.faults[ev["id"]] = ev
        elif kind in ("fault_reverted",):
            self.faults.pop(ev["id"], None)
        elif kind == "target_exited":
            self.exited.append(_exit_line(ev))
        if kind == "safeguard":
            self.tripped[ev.get("probe", "")] = ev.get("reason", "")
        if kind in ("safeguard", "interrupt", "revert_failed", "error", "recovered", "operator"):
            self.notes.append(f"{kind}: " + ", ".join(f"{k}={v}" for k, v in ev.items()
                                                      if k not in ("t", "event", "traceback")))

    def _key(self, probe: str) -> str | None:
        """The value the sparkline follows: the first judged key that is a number, else the first number."""
        recent = list(self.history.get(probe, ()))
        for s in reversed(recent):
            values = s.get("values") or {}
            for k in [*self.watch.get(probe, []), *values]:
                if _num(values.get(k)) is not None:
                    return k
        return None

    def _render(self) -> Group:
        with self._lock:
            return self._render_locked()

    def _render_locked(self) -> Group:
        head = Text.assemble(("chaoskit ", "bold"), (self.name, "bold cyan"), "  phase: ", (self.state, "yellow"))
        probes = Table(title="probes", expand=True, title_justify="left")
        for col in ("probe", "phase", "verdict", "history", "failed / samples", "last value"):
            probes.add_column(col)
        for name, s in self.samples.items():
            key = self._key(name)
            trend = Text("")
            if key is not None:
                values = [_num((h.get("values") or {}).get(key)) for h in self.history[name]]
                last = next((v for v in reversed(values) if v is not None), None)
                trend = Text.assemble((key + " ", "dim"), sparkline(values, HISTORY),
                                      f" {last:g}" if last is not None else "")
            counts = Text()
            for phase, (n, bad) in self.counts.get(name, {}).items():
                style = "red" if bad and phase in ("before", "during", "after") else ("yellow" if bad else "green")
                counts.append(f"{phase} {bad}/{n} ", style=style)
            probes.add_row(name, s["phase"], Text(s["verdict"], style=VERDICT_STYLE.get(s["verdict"], "")), trend,
                           counts, _values(s)[:100])
        parts: list[Any] = [head, probes]
        if self.safeguards:
            guards = Table(title="safeguards", expand=True, title_justify="left")
            for col in ("probe", "abort when", "state", "last"):
                guards.add_column(col)
            for g in self.safeguards:
                last = self.samples.get(g["probe"])
                if g["probe"] in self.tripped:
                    state = Text(f"TRIPPED: {self.tripped[g['probe']]}", style="bold red")
                else:
                    state = Text("watching", style="green") if last else Text("waiting for a sample", style="dim")
                shown = ", ".join(f"{m}={(last.get('values') or {}).get(m)}" for m in g.get("metrics", [])
                                  if last and m in (last.get("values") or {})) if last else ""
                guards.add_row(g["probe"], " or ".join(g["rules"]), state,
                               shown or ((last.get("error") or "") if last else ""))
            parts.append(guards)
        faults = Table(title="active faults", expand=True, title_justify="left")
        for col in ("#", "type", "step", "time left"):
            faults.add_column(col)
        now = time.time()
        for f in self.faults.values():
            left = f"{max(0.0, f['applied_at'] + f['duration_s'] - now):.1f}s" if f.get("duration_s") else "until rollback"
            faults.add_row(str(f["id"]), f["type"], f["step"], left)
        parts.append(faults)
        parts += [Text(e, style="bold yellow") for e in self.exited[-5:]]
        return Group(*parts, *(Text(n, style="bold red") for n in self.notes[-5:]))


def _exit_line(ev: dict[str, Any]) -> str:
    """A target_exited event: `fault #1 process.signal (stop-stub): PID 29566 triton_python_backend_stub exited
    during the fault`."""
    step = f" ({ev['step']})" if ev.get("step") else ""
    return f"fault #{ev.get('id')} {ev.get('type', '')}{step}: {ev.get('text', '')}"


def _num(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) else None
