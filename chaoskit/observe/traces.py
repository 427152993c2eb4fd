"""A run as OpenTelemetry traces over OTLP/HTTP (the official SDK, its own TracerProvider): a span for the run,
one per phase and one per fault (apply to revert), each probe sample an event on its phase. While the run lasts
its processes' environment carries the run span's context (TRACEPARENT, OpenTelemetry's environment carrier) and
the endpoint (CHAOSKIT_OTLP_ENDPOINT): the load generator sends that traceparent on every request and the proxy
helpers export their fault spans there (EnvCarrier; restored when the run ends)."""

from __future__ import annotations

import os
import threading
from collections.abc import MutableMapping, Sequence
from typing import Any

from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult
from opentelemetry.trace import Span, Status, StatusCode

from chaoskit.load.traceparent import ENV as TRACEPARENT_ENV
from chaoskit.load.traceparent import format_header
from chaoskit.model.enums import RunVerdict
from chaoskit.model.events import (
    Event,
    ExperimentRecorded,
    FaultApplied,
    FaultReverted,
    Planned,
    RevertFailed,
    RunEnded,
    RunStarted,
    Sample,
    StateChanged,
)
from chaoskit.observe.fault_labels import FaultLabels
from chaoskit.observe.metrics import number


def ns(t: float) -> int:
    return int(round(t * 1e9))


class _Recording(SpanExporter):
    """The OTLP exporter, remembering why its latest export failed (a warning for the journal at the end)."""

    def __init__(self, inner: SpanExporter):
        self.inner, self.error = inner, None

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        try:
            result = self.inner.export(spans)
        except Exception as e:
            self.error = f"{type(e).__name__}: {e}"
            return SpanExportResult.FAILURE
        if result is not SpanExportResult.SUCCESS:
            self.error = f"{len(spans)} spans not accepted"
        return result

    def shutdown(self) -> None:
        self.inner.shutdown()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return self.inner.force_flush(timeout_millis)


ENDPOINT_ENV = "CHAOSKIT_OTLP_ENDPOINT"  # the /v1/traces URL the proxy helpers export to (injectors.proxy.trace)


class EnvCarrier:
    """Puts variables into an environment (os.environ: what the run's subprocesses and helpers inherit) and puts
    back what was there before."""

    def __init__(self, environ: MutableMapping[str, str]):
        self.environ = environ
        self._saved: dict[str, str | None] = {}

    def set(self, values: dict[str, str]) -> None:
        for k, v in values.items():
            self._saved.setdefault(k, self.environ.get(k))
            self.environ[k] = v

    def restore(self) -> None:
        for k, v in self._saved.items():
            if v is None:
                self.environ.pop(k, None)
            else:
                self.environ[k] = v
        self._saved.clear()


class RunTracer:
    """A Journal sink; close() flushes within the timeout and says why the export failed (None: exported)."""

    def __init__(self, endpoint: str, experiment: str, run_id: str, timeout_s: float,
                 environ: MutableMapping[str, str] | None = None):
        url = endpoint.rstrip("/")
        url = url if url.endswith("/v1/traces") else url + "/v1/traces"
        self.url, self.timeout_s = url, timeout_s
        self.carrier = EnvCarrier(os.environ if environ is None else environ)
        self.exporter = _Recording(OTLPSpanExporter(endpoint=url, timeout=timeout_s))
        resource = Resource.create({"service.name": "chaoskit", "chaoskit.experiment": experiment,
                                    "chaoskit.run_id": run_id})
        self.provider = TracerProvider(resource=resource, shutdown_on_exit=False)  # close() shuts it down, bounded
        self.provider.add_span_processor(BatchSpanProcessor(self.exporter, schedule_delay_millis=500,
                                                            export_timeout_millis=timeout_s * 1000))
        self.tracer = self.provider.get_tracer("chaoskit")
        self.attrs = {"chaoskit.experiment": experiment, "chaoskit.run_id": run_id}
        self._lock = threading.Lock()  # revert threads journal too
        self._run: Span | None = None
        self._phase: Span | None = None
        self._faults: dict[int, Span] = {}
        self._names = FaultLabels()
        self._flushing: threading.Thread | None = None
        self._done = threading.Event()
        self._flushed = False

    def _child(self, name: str, t: float, parent: Span | None, attrs: dict[str, Any]) -> Span:
        ctx = trace.set_span_in_context(parent) if parent is not None else None
        return self.tracer.start_span(name, context=ctx, start_time=ns(t), attributes={**self.attrs, **attrs})

    def __call__(self, ev: Event) -> None:
        with self._lock:
            if isinstance(ev, ExperimentRecorded):
                self._names.document = ev.document
            elif isinstance(ev, Planned):
                self._names.plan = list(ev.steps)
            elif isinstance(ev, RunStarted):
                self._run = self._child(f"chaoskit run {ev.experiment}", ev.t, None, {})
                self._propagate(self._run)
            elif isinstance(ev, StateChanged) and self._run is not None:
                if self._phase is not None:
                    self._phase.end(end_time=ns(ev.t))
                self._phase = self._child(f"phase {ev.state}", ev.t, self._run, {"chaoskit.phase": ev.state})
            elif isinstance(ev, (FaultApplied, FaultReverted, RevertFailed)):
                self._fault(ev)
            elif isinstance(ev, Sample):
                self._sample(ev)
            elif isinstance(ev, RunEnded):
                self._ended(ev)

    def _propagate(self, span: Span) -> None:
        """The run span's context to what the run starts from now on (load workers, helpers, commands)."""
        ctx = span.get_span_context()
        self.carrier.set({TRACEPARENT_ENV: format_header(ctx.trace_id, ctx.span_id), ENDPOINT_ENV: self.url})

    def _fault(self, ev: FaultApplied | FaultReverted | RevertFailed) -> None:
        if isinstance(ev, FaultApplied):
            labels = {f"chaoskit.fault.{k}": v for k, v in self._names.labels(ev).items()}
            self._faults[ev.id] = self._child(f"fault {ev.step}", ev.applied_at or ev.t, self._phase or self._run,
                                              {**labels, "chaoskit.fault.id": ev.id})
            return
        span = self._faults.pop(ev.id, None)
        if span is None:
            return
        if isinstance(ev, RevertFailed):
            span.set_status(Status(StatusCode.ERROR, f"revert failed: {ev.error}"))
        span.end(end_time=ns(ev.t))

    def _sample(self, s: Sample) -> None:
        span = self._phase or self._run
        if span is None:
            return
        attrs: dict[str, Any] = {"chaoskit.probe": s.probe, "chaoskit.sample.phase": s.phase.value,
                                 "chaoskit.sample.verdict": s.verdict.value, "chaoskit.sample.duration_ms": s.duration_ms}
        for key, value in s.values.items():
            if (v := number(value)) is not None:
                attrs[f"chaoskit.value.{key}"] = v
        span.add_event(f"sample {s.probe}", timestamp=ns(s.t), attributes=attrs)

    def _ended(self, ev: RunEnded) -> None:
        self.carrier.restore()
        for span in [*self._faults.values(), self._phase]:
            if span is not None:
                span.end(end_time=ns(ev.t))
        self._faults.clear()
        self._phase = None
        if self._run is not None:
            self._run.set_attributes({"chaoskit.verdict": ev.verdict.value, "chaoskit.exit_code": ev.exit_code})
            if ev.verdict is not RunVerdict.HELD:
                self._run.set_status(Status(StatusCode.ERROR, f"{ev.verdict.value}: {ev.reason}"))
            self._run.end(end_time=ns(ev.t))
            self._run = None

    def flush(self) -> None:
        """Start exporting what is left (the run has ended), then shut the provider down, in a thread of its own."""
        if self._flushing is None:
            self._flushing = threading.Thread(target=self._flush, name="chaoskit-otlp", daemon=True)
            self._flushing.start()

    def _flush(self) -> None:
        self._flushed = self.provider.force_flush(int(self.timeout_s * 1000))
        self._done.set()
        self.provider.shutdown()

    def close(self) -> str | None:
        """Wait for the flush (at most the timeout and a second): why the export failed, None if it did not."""
        with self._lock:
            self.carrier.restore()  # a run that never ended (its start failed) leaves nothing behind either
        self.flush()
        if not self._done.wait(self.timeout_s + 1.0):
            return self.exporter.error or f"no answer within {self.timeout_s:g}s"
        if self.exporter.error or not self._flushed:
            return self.exporter.error or f"not flushed within {self.timeout_s:g}s"
        return None
