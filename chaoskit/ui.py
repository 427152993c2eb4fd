"""How `chaoskit run` shows progress: a live rich view on a TTY, plain timestamped lines otherwise (CI)."""

from __future__ import annotations

import threading
import time
from typing import Any

from rich.console import Console, Group
from rich.live import Live
from rich.table import Table
from rich.text import Text

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
        elif kind == "plan":
            line = "plan: " + " | ".join(f"{p['step']}: {'; '.join(p['changes'])}" for p in ev["steps"])
        elif kind == "end":
            line = f"verdict {ev['verdict']} (exit {ev['exit_code']})"
        else:
            line = kind + " " + " ".join(f"{k}={v}" for k, v in ev.items() if k not in ("t", "event", "traceback"))
        self.console.print(f"{ts} {line}", markup=False, highlight=False, soft_wrap=True)


class LiveView:
    """Phase, each probe's last value and verdict, active faults with time left."""

    def __init__(self, console: Console, name: str):
        self.console, self.name = console, name
        self.state = "pending"
        self.samples: dict[str, dict[str, Any]] = {}
        self.faults: dict[int, dict[str, Any]] = {}
        self.notes: list[str] = []
        self._lock = threading.Lock()  # events arrive from the loop and from revert threads; Rich renders in its own
        self.live = Live(self._render(), console=console, refresh_per_second=4, transient=False,
                         get_renderable=self._render)

    def __enter__(self) -> LiveView:
        self.live.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self.live.__exit__(*exc)

    def __call__(self, ev: dict[str, Any]) -> None:
        with self._lock:
            self._update(ev)

    def _update(self, ev: dict[str, Any]) -> None:
        kind = ev["event"]
        if kind == "state":
            self.state = ev["state"]
        elif kind == "sample":
            self.samples[ev["probe"]] = ev
        elif kind == "fault_applied":
            self.faults[ev["id"]] = ev
        elif kind in ("fault_reverted",):
            self.faults.pop(ev["id"], None)
        elif kind in ("safeguard", "interrupt", "revert_failed", "error", "recovered"):
            self.notes.append(f"{kind}: " + ", ".join(f"{k}={v}" for k, v in ev.items()
                                                      if k not in ("t", "event", "traceback")))

    def _render(self) -> Group:
        with self._lock:
            return self._render_locked()

    def _render_locked(self) -> Group:
        head = Text.assemble(("chaoskit ", "bold"), (self.name, "bold cyan"), "  phase: ", (self.state, "yellow"))
        probes = Table(title="probes", expand=True, title_justify="left")
        for col in ("probe", "phase", "verdict", "last value"):
            probes.add_column(col)
        for name, s in self.samples.items():
            probes.add_row(name, s["phase"], Text(s["verdict"], style=VERDICT_STYLE.get(s["verdict"], "")),
                           _values(s)[:120])
        faults = Table(title="active faults", expand=True, title_justify="left")
        for col in ("#", "type", "step", "time left"):
            faults.add_column(col)
        now = time.time()
        for f in self.faults.values():
            left = f"{max(0.0, f['applied_at'] + f['duration_s'] - now):.1f}s" if f.get("duration_s") else "until rollback"
            faults.add_row(str(f["id"]), f["type"], f["step"], left)
        return Group(head, probes, faults, *(Text(n, style="bold red") for n in self.notes[-5:]))
