"""llm.proxy's fault spans: a request with faults drawn whose traceparent asks for sampling gets a span (a child of
that traceparent, and the parent the request goes upstream with: its traceparent is rewritten) and under it one
span per fault drawn (kind, share, whether its effect happened, what it cut or delayed). Imported only when the
run is traced."""

from __future__ import annotations

import dataclasses
import os
import random
import re
import time
from typing import Any

from chaoskit.injectors.llm_proxy.faults import Fault, FaultTable, Plan, Request
from chaoskit.injectors.proxy.trace import Attributes, SpanRecord, SpanSink, incoming, scalar_params
from chaoskit.load.traceparent import format_header

_TRACEPARENT = re.compile(rb"(\r\ntraceparent[ \t]*:)[^\r\n]*", re.IGNORECASE)


class Counted:
    """One request's view of a shared fault: reads fall through to it; `applied += 1` counts on both, so the
    request's span knows whether the effect happened to it (the fault's counter is for every request)."""

    __slots__ = ("fault", "hits")

    def __init__(self, fault: Fault):
        object.__setattr__(self, "fault", fault)
        object.__setattr__(self, "hits", 0)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.fault, name)

    def __setattr__(self, name: str, value: Any) -> None:
        if name == "applied":
            object.__setattr__(self, "hits", self.hits + value - self.fault.applied)
        setattr(self.fault, name, value)


@dataclasses.dataclass
class RequestTrace:
    """What a traced request's spans need: its trace, when it came, the faults its plan carries out."""

    trace_id: int
    parent_id: int
    span_id: int  # the request's span in the proxy: the parent it goes upstream with
    start_ns: int
    counted: dict[str, Counted]

    def propagate(self, raw: bytes) -> bytes:
        """The request as it goes upstream: its traceparent names the proxy's span (the upstream's spans of it
        nest under it, beside the faults')."""
        value = b" " + format_header(self.trace_id, self.span_id).encode()
        return _TRACEPARENT.sub(lambda m: m.group(1) + value, raw, count=1)


class LlmTracer:
    """The spans of one llm.proxy process (None from `from_env` when the run is not traced)."""

    def __init__(self, sink: SpanSink, faults: FaultTable):
        self.sink = sink
        self.by_name = {f.name: f for f in faults.faults}
        self.ids = random.Random()  # seeded from the OS: span ids, not the faults' seeded draws

    @classmethod
    def from_env(cls, faults: FaultTable) -> LlmTracer | None:
        sink = SpanSink.from_env(os.environ, "chaoskit llm.proxy")
        return cls(sink, faults) if sink is not None else None

    def begin(self, req: Request, plan: Plan) -> RequestTrace | None:
        """A request with faults drawn: traced when its traceparent asks for it (then its plan's faults count
        per request); None otherwise (nothing recorded)."""
        ctx = incoming(req.header("traceparent"))
        if ctx is None:
            return None
        counted: dict[str, Counted] = {}
        for field in dataclasses.fields(plan):
            value = getattr(plan, field.name)
            if isinstance(value, Fault):
                counted[value.name] = Counted(value)
                setattr(plan, field.name, counted[value.name])
        if plan.local is not None and isinstance(plan.local.fault, Fault):
            counted[plan.local.fault.name] = Counted(plan.local.fault)
            plan.local.fault = counted[plan.local.fault.name]  # type: ignore[assignment]
        return RequestTrace(ctx[0], ctx[1], self.ids.getrandbits(64) or 1, time.time_ns(), counted)

    def end(self, t: RequestTrace, req: Request, plan: Plan, events: Any, client_gone: bool) -> None:
        """The exchange is over: its span, with one per fault drawn under it."""
        end = time.time_ns()
        common: Attributes = {"chaoskit.proxy": "llm.proxy", "http.request.method": req.method.decode("latin-1"),
                                  "url.path": req.path, "chaoskit.proxy.client_gone": client_gone,
                                  "chaoskit.proxy.faults": ",".join(plan.names)}
        if plan.local is not None:
            common["chaoskit.proxy.answered_status"] = plan.local.status  # answered by the proxy itself
        if events is not None:  # an SSE stream taken apart: what reached the client
            common.update({"chaoskit.proxy.tokens_forwarded": events.tokens,
                           "chaoskit.proxy.delay_added_s": round(events.shift, 6),
                           "chaoskit.proxy.cut": bool(events.stopped), "chaoskit.proxy.stalled": bool(events.frozen)})
        children = []
        for name in plan.names:
            f = self.by_name.get(name)
            if f is None:
                continue
            c = t.counted.get(name)
            attrs: Attributes = {"chaoskit.fault.name": name, "chaoskit.fault.type": f.type,
                                 "chaoskit.fault.share": f.share, "chaoskit.fault.applied": bool(c and c.hits),
                                 **scalar_params("chaoskit.fault.param.", dataclasses.asdict(f.params))}
            if f.type == "delay" and c and c.hits:
                attrs["chaoskit.proxy.delay_s"] = round(plan.delay_s, 6)
            children.append(SpanRecord(f"llm.proxy {f.type}", t.trace_id, t.span_id, t.start_ns, end, attrs))
        common["chaoskit.proxy.applied"] = ",".join(str(r.attributes["chaoskit.fault.name"]) for r in children
                                                    if r.attributes["chaoskit.fault.applied"])
        self.sink.add(SpanRecord("llm.proxy request", t.trace_id, t.parent_id, t.start_ns, end, common, t.span_id,
                                 tuple(children)))
