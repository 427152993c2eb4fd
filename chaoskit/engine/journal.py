"""The run journal: typed events (model.events) appended as JSON lines and written through to the kernel as they
happen, so even SIGKILL leaves a trace (the page cache outlives the process); fsync'd once, at the end: an fsync
per event cost ~2 ms of the run's loop each (0.8 s of a 100-fault apply), and only a host crash needs it, which
the ledger — fsync'd, the record that reverts — is for. Read back typed, journals of earlier versions included."""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Callable
from pathlib import Path

from chaoskit.model.events import Event, from_json

Listener = Callable[[Event], None]


class Journal:
    """Writes each event to `path` and hands it to listeners (the live display); sinks (exporters) get every
    event journaled, the recorded facts too."""

    def __init__(self, path: Path | None, listeners: list[Listener] | None = None):
        self.path = path
        self.listeners = list(listeners or [])
        self.sinks: list[Listener] = []  # called after each event is written; must return at once
        self._fh = None
        self._lock = threading.Lock()
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
            self._fh = open(path, "w", encoding="utf-8")  # a run's own: an earlier run's --out is not mixed in

    def emit(self, event: Event) -> Event:
        self.record(event)
        for listener in self.listeners:
            try:
                listener(event)
            except Exception:  # a display bug must not break a run
                pass
        return event

    def record(self, event: Event) -> Event:
        """Journal an event without telling the listeners (facts for the report, not news for the display).
        Events are not kept in memory: a long run with frequent probes must not grow with its journal."""
        if self._fh is not None:
            line = json.dumps(event.to_json(), default=str, separators=(",", ":"))
            with self._lock:  # the run's loop and its revert threads both write
                if self._fh is not None:  # not closed meanwhile
                    self._fh.write(line + "\n")
                    self._fh.flush()
        for sink in self.sinks:
            try:
                sink(event)
            except Exception:  # an exporter's bug must not break a run: the journal is the source of truth
                pass
        return event

    def close(self) -> None:
        with self._lock:
            if self._fh is not None:
                self._fh.flush()
                os.fsync(self._fh.fileno())
                self._fh.close()
                self._fh = None


def read_journal(path: Path) -> list[Event]:
    """The events of a journal file; a torn last line (a SIGKILL mid-write) and blank lines are skipped."""
    events = []
    with open(path, encoding="utf-8") as fh:
        for line in fh:
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(obj, dict) and "event" in obj:
                events.append(from_json(obj))
    return events
