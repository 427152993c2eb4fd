"""The spans a proxy helper records on its requests' traces: plain records on the event loop; the OpenTelemetry SDK
imported, and the spans exported over OTLP/HTTP, in a thread of its own. Imported by the proxy servers only in a
traced run (CHAOSKIT_OTLP_ENDPOINT set), after they said `ready`."""

from __future__ import annotations

import logging
import re
import threading
import time
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple, Protocol

from chaoskit.load.traceparent import parse

ENDPOINT_ENV = "CHAOSKIT_OTLP_ENDPOINT"  # set by a traced `chaoskit run` (observe.traces.EnvCarrier) for its life
EVERY_S = 0.2  # how often the thread exports what was recorded
KEEP = 10_000  # records waiting at most (a dead endpoint drops the oldest, never grows the helper)
Attributes = dict[str, str | bool | int | float]  # a span's attributes: OpenTelemetry's scalar attribute values


@dataclass(frozen=True)
class SpanRecord:
    """One span to export: a child of the request's traceparent (trace id, parent span id), times in ns; its own
    span id when one was chosen already (sent upstream), and its children (their trace and parent are its)."""

    name: str
    trace_id: int
    parent_id: int
    start_ns: int
    end_ns: int
    attributes: Attributes
    span_id: int | None = None
    children: tuple[SpanRecord, ...] = ()


class Toxic(Protocol):
    """A toxic drawn for a connection (proxy.server.Toxic), as its span names it."""

    type: str
    stream: str
    toxicity: float

    def params(self) -> dict[str, float]: ...


def incoming(value: str | None) -> tuple[int, int] | None:
    """(trace id, parent span id) of a request's traceparent when it asks for sampling; None: record nothing."""
    parsed = parse(value)
    return (parsed[0], parsed[1]) if parsed and parsed[2] & 1 else None


def scalar_params(prefix: str, params: Mapping[str, Any]) -> Attributes:
    """A fault's parameters as span attributes (the scalar ones)."""
    return {f"{prefix}{k}": v for k, v in params.items() if isinstance(v, (str, bool, int, float))}


class SinkStats(NamedTuple):
    """What a proxy's spans did: the endpoint, the spans it accepted and those dropped (export failed, queue
    full), and why the latest export failed (None: it did not)."""

    endpoint: str
    spans_exported: int
    spans_lost: int
    error: str | None

    def to_json(self) -> dict[str, str | int | None]:
        return {"endpoint": self.endpoint, "spans_exported": self.spans_exported, "spans_lost": self.spans_lost,
                "error": self.error}


class SpanSink:
    """Records spans (add, on the event loop: an append) and exports them from a thread, started by start() (the
    SDK's import, ~60 ms of CPU, happens there: while the proxy has just started, not on a request's path).
    close() sends what is left within its timeout."""

    def __init__(self, url: str, service: str, timeout_s: float = 2.0):
        self.url, self.service, self.timeout_s = url, service, timeout_s
        self.pending: deque[SpanRecord] = deque(maxlen=KEEP)
        self.error: str | None = None  # why the latest export failed (None: it did not)
        self.exported = self.lost = 0  # spans accepted by the endpoint / dropped (export failed, queue full)
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @classmethod
    def from_env(cls, environ: Mapping[str, str], service: str) -> SpanSink | None:
        url = environ.get(ENDPOINT_ENV)
        return cls(url, service).start() if url else None

    def start(self) -> SpanSink:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="chaoskit-proxy-otlp", daemon=True)
            self._thread.start()
        return self

    def add(self, rec: SpanRecord) -> None:
        if len(self.pending) == KEEP:
            self.lost += 1  # the oldest goes
        self.pending.append(rec)
        if not self.exported:  # until the endpoint has accepted one, each goes at once: close() waits for none
            self._wake.set()

    def stats(self) -> SinkStats:
        """For the proxy's /chaoskit/stats (so the journal's fault_observed details): what reached the endpoint."""
        return SinkStats(self.url, self.exported, self.lost, self.error)

    def close(self, timeout_s: float = 0.5) -> None:
        """Export what is left, waiting at most timeout_s, and only when the endpoint has accepted spans and its
        latest export did not fail (the SDK's exporter retries a refused connection until its own timeout: an
        endpoint that is down must not hold up the helper's exit, the fault's revert)."""
        if self._thread is None:
            return
        self._stop.set()
        self._wake.set()
        self._thread.join(timeout_s if self.exported and self.error is None else 0.0)

    def _run(self) -> None:
        try:
            export = _exporter(self.url, self.service, self.timeout_s)
        except Exception as e:  # the SDK missing: nothing is exported, the proxy goes on
            self.error = f"{type(e).__name__}: {e}"
            return
        while True:
            stopping = self._stop.is_set()
            batch = [self.pending.popleft() for _ in range(len(self.pending))]
            if batch:
                self.error = export(batch)
                if self.error is None:
                    self.exported += len(batch)
                else:
                    self.lost += len(batch)
            if stopping:
                return
            self._wake.wait(EVERY_S)
            self._wake.clear()


def _exporter(url: str, service: str, timeout_s: float):  # noqa: ANN202 (the SDK's types are imported here)
    """A function exporting records as SDK spans (None when accepted, else why not). The SDK's log lines are
    off: nobody reads the helper's stderr after `ready` (its stats say why an export failed)."""
    logging.getLogger("opentelemetry").setLevel(logging.CRITICAL + 1)
    from opentelemetry import trace
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor, TracerProvider
    from opentelemetry.sdk.trace.export import SpanExportResult
    from opentelemetry.sdk.trace.id_generator import RandomIdGenerator

    class Preset(RandomIdGenerator):
        """The span id a record chose (the one its request went upstream with), else a random one."""

        def __init__(self) -> None:
            self.next: int | None = None

        def generate_span_id(self) -> int:
            chosen, self.next = self.next, None
            return chosen or super().generate_span_id()

    class Collect(SpanProcessor):
        def __init__(self) -> None:
            self.spans: list[ReadableSpan] = []

        def on_end(self, span: ReadableSpan) -> None:
            self.spans.append(span)

    collect, ids = Collect(), Preset()
    provider = TracerProvider(resource=Resource.create({"service.name": service}), id_generator=ids,
                              shutdown_on_exit=False)
    provider.add_span_processor(collect)
    tracer = provider.get_tracer("chaoskit.proxy")
    exporter = OTLPSpanExporter(endpoint=url, timeout=timeout_s)
    sampled = trace.TraceFlags(trace.TraceFlags.SAMPLED)

    def emit(r: SpanRecord, context: Any) -> None:
        ids.next = r.span_id
        span = tracer.start_span(r.name, context=context, start_time=r.start_ns, attributes=r.attributes)
        for child in r.children:
            emit(child, trace.set_span_in_context(span))
        span.end(end_time=r.end_ns)

    def export(batch: list[SpanRecord]) -> str | None:
        for r in batch:
            parent = trace.NonRecordingSpan(trace.SpanContext(r.trace_id, r.parent_id, is_remote=True,
                                                              trace_flags=sampled))
            emit(r, trace.set_span_in_context(parent))
        spans, collect.spans = collect.spans, []
        try:
            ok = exporter.export(spans) is SpanExportResult.SUCCESS
        except Exception as e:
            return f"{type(e).__name__}: {e}"
        return None if ok else f"{len(spans)} spans not accepted"

    return export


_REQUEST_LINE = re.compile(rb"[A-Z]{3,10} [^ \r\n]+ HTTP/1\.[01]\r\n")
_TRACEPARENT = re.compile(rb"\r\ntraceparent[ \t]*:[ \t]*([^\r\n]*)", re.IGNORECASE)


def http_traceparent(first: bytes) -> tuple[int, int] | None:
    """The sampled traceparent of the HTTP/1 request head that `first` (a connection's first bytes from the
    client) begins with; None for anything else (TLS, another protocol, no header, a head cut short)."""
    if _REQUEST_LINE.match(first) is None:
        return None
    end = first.find(b"\r\n\r\n")
    m = _TRACEPARENT.search(first, 0, end + 2 if end >= 0 else len(first))
    return incoming(m.group(1).decode("latin-1")) if m else None


class ConnTrace:
    """One network.proxy connection with toxics drawn: traced once its first request head names a trace."""

    def __init__(self, toxics: list[Toxic]):
        self.toxics, self.start_ns = toxics, time.time_ns()
        self.ctx: tuple[int, int] | None = None
        self.aborted = False

    def spans(self) -> list[SpanRecord]:
        """A span per toxic drawn, ending now (nothing when no trace was found)."""
        if self.ctx is None:
            return []
        end = time.time_ns()
        return [SpanRecord(f"network.proxy {t.type}", self.ctx[0], self.ctx[1], self.start_ns, end,
                           {"chaoskit.proxy": "network.proxy", "chaoskit.toxic.type": t.type,
                            "chaoskit.toxic.stream": t.stream, "chaoskit.toxic.toxicity": float(t.toxicity),
                            "chaoskit.proxy.aborted": self.aborted,
                            **scalar_params("chaoskit.toxic.param.", t.params())})
                for t in self.toxics]


class NetTracer:
    """network.proxy's spans: one per toxic drawn for a connection whose first request carries a sampled
    traceparent, from the connection's start to its end (or to the helper's exit)."""

    def __init__(self, sink: SpanSink):
        self.sink = sink
        self.live: set[ConnTrace] = set()

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> NetTracer | None:
        sink = SpanSink.from_env(environ, "chaoskit network.proxy")
        return cls(sink) if sink is not None else None

    def begin(self, toxics: list[Toxic]) -> ConnTrace:
        t = ConnTrace(toxics)
        self.live.add(t)
        return t

    @staticmethod
    def first(t: ConnTrace, data: bytes) -> None:
        """The connection's first bytes from the client: its trace, if they are a request head naming one."""
        t.ctx = http_traceparent(data)

    def end(self, t: ConnTrace) -> None:
        self.live.discard(t)
        for rec in t.spans():
            self.sink.add(rec)

    def close(self) -> None:
        """The helper ends: the connections still open end here, then what is left is sent (bounded)."""
        for t in list(self.live):
            self.end(t)
        self.sink.close()
