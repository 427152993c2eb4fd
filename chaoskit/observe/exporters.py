"""The exporters of one run, attached to its journal for its life: the /metrics endpoint, the final push to a
Pushgateway and OTLP spans. Any of them failing is a warning (journal, stderr), never the run's verdict."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from rich.markup import escape

from chaoskit.engine.journal import Journal
from chaoskit.model.events import ErrorNoted, Event, RunEnded, RunStarted
from chaoskit.observe.metrics import RunMetrics
from chaoskit.observe.options import ObserveOptions
from chaoskit.observe.push import FinalPush
from chaoskit.observe.server import MetricsServer


class Exporters:
    """Attach with `with Exporters(...)` around the run; `say` prints a line for the operator (stderr)."""

    def __init__(self, opts: ObserveOptions, experiment: str, run_id: str, journal: Journal,
                 say: Callable[[str], None]):
        self.opts, self.experiment, self.run_id, self.journal, self.say = opts, experiment, run_id, journal, say
        self.metrics: RunMetrics | None = None
        self.server: MetricsServer | None = None
        self.push: FinalPush | None = None
        self.tracer: Any = None
        self._sinks: list[Callable[[Event], None]] = []
        self._started = False  # the journal has the run's start: warnings go into it from then on
        self._pending: list[ErrorNoted] = []

    def __enter__(self) -> Exporters:
        if self.opts.wanted:
            self._start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    def _start(self) -> None:
        o = self.opts
        if o.metrics_port is not None or o.pushgateway:
            self.metrics = RunMetrics(self.experiment, self.run_id)
            self._attach(self.metrics)
        if o.metrics_port is not None and self.metrics is not None:
            try:
                self.server = MetricsServer(self.metrics.registry, o.metrics_addr, o.metrics_port)
                self.say(f"metrics: {escape(self.server.url)}")
            except OSError as e:
                self.warn("metrics", f"cannot serve /metrics on {o.metrics_addr}:{o.metrics_port}: {e}")
        if o.pushgateway and self.metrics is not None:
            self.push = FinalPush(o.pushgateway, self.metrics.registry,
                                  {"experiment": self.experiment, "run_id": self.run_id}, o.timeout_s)
        if o.otlp_endpoint:
            self._start_otlp(o.otlp_endpoint)
        self._attach(self._on_event)  # last: the push starts once the other sinks have folded the run's end

    def _start_otlp(self, endpoint: str) -> None:
        try:
            from chaoskit.observe.traces import RunTracer

            self.tracer = RunTracer(endpoint, self.experiment, self.run_id, self.opts.timeout_s)
        except Exception as e:  # the SDK missing or refusing the endpoint: a warning
            self.warn("otlp", f"no traces to {endpoint}: {type(e).__name__}: {e}")
            return
        self._attach(self.tracer)

    def _attach(self, sink: Callable[[Event], None]) -> None:
        self._sinks.append(sink)
        self.journal.sinks.append(sink)

    def _on_event(self, ev: Event) -> None:
        if isinstance(ev, RunStarted):
            self._started = True
            pending, self._pending = self._pending, []
            for warning in pending:
                self.journal.emit(warning)
        elif isinstance(ev, RunEnded):  # each in a thread of its own: the run's end is not held up by them
            if self.push is not None:
                self.push.start()
            if self.tracer is not None:
                self.tracer.flush()

    def warn(self, where: str, text: str) -> None:
        """A warning on stderr now and in the journal (once the run has started: its records come first)."""
        self.say(f"[yellow]warning:[/] {escape(where)}: {escape(text)} (the verdict is not affected)")
        warning = ErrorNoted(where=where, error=f"warning: {text}")
        if self._started:
            self.journal.emit(warning)
        else:
            self._pending.append(warning)

    def close(self) -> None:
        """After the run: wait for the push (bounded), flush the traces (bounded), stop serving, detach."""
        if self.push is not None and (error := self.push.wait()):
            self.warn("pushgateway", f"could not push the final state to {self.opts.pushgateway}: {error}")
        if self.tracer is not None and (error := self.tracer.close()):
            self.warn("otlp", f"could not export the traces to {self.opts.otlp_endpoint}: {error}")
        if self.server is not None:
            self.server.stop()
        for sink in self._sinks:
            if sink in self.journal.sinks:
                self.journal.sinks.remove(sink)
        self._sinks.clear()

