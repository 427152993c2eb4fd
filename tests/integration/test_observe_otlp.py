"""`chaoskit run --otlp-endpoint`: an in-test OTLP/HTTP receiver decodes what the run exported (opentelemetry-proto):
one trace, a span for the run, each phase and the fault (its window exactly the journal's), samples as events; the
load generator's traceparent on the wire (native and python senders) and llm.proxy's fault spans under it."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

# a dependency of ours (opentelemetry-exporter-otlp-proto-http brings it): missing is a broken install, not a skip
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2 as pb

from chaoskit.injectors.base import FaultContext
from chaoskit.injectors.flood.fault import Flood
from chaoskit.injectors.llm_proxy.fault import LlmProxy, stats_of
from chaoskit.load.runner import run_load
from chaoskit.load.spec import LoadSpec
from chaoskit.load.traceparent import parse
from tests.conftest import chaoskit, free_port, write

EXPERIMENT = """\
apiVersion: chaoskit/v1
kind: Experiment
metadata: {{name: otlp-run}}
steadyState:
  probes:
    - name: up
      type: command
      argv: ["true"]
      expect: {{exit_code: "== 0"}}
  during: {{every: 0.5s}}
  after: {{within: 5s, every: 0.5s}}
method:
  - name: freeze
    inject: {{type: process.signal, pid: {pid}, signal: SIGSTOP}}
    duration: 1.5s
"""


class _Receiver(BaseHTTPRequestHandler):
    got: list[tuple[str, bytes]] = []

    def do_POST(self) -> None:  # noqa: N802
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        self.got.append((self.path, body))
        reply = pb.ExportTraceServiceResponse().SerializeToString()
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", str(len(reply)))
        self.end_headers()
        self.wfile.write(reply)

    def log_message(self, *_args: object) -> None:
        pass


def serve(handler: type[BaseHTTPRequestHandler]) -> Iterator[str]:
    """An in-test HTTP server on a free loopback port for the test's life; its base URL."""
    srv = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=srv.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{srv.server_address[1]}"
    srv.shutdown()
    srv.server_close()
    thread.join(2)


@pytest.fixture
def receiver() -> Iterator[str]:
    _Receiver.got = []
    yield from serve(_Receiver)


def _spans() -> list:
    out = []
    for path, body in _Receiver.got:
        assert path == "/v1/traces"
        req = pb.ExportTraceServiceRequest()
        req.ParseFromString(body)
        out += [s for rs in req.resource_spans for ss in rs.scope_spans for s in ss.spans]
    return out


def test_the_run_its_phases_and_its_fault_are_spans_with_the_journal_times(receiver, sleeper, tmp_path, state_dir):
    exp = write(tmp_path / "e.yaml", EXPERIMENT.format(pid=sleeper.pid))
    proc = chaoskit("run", str(exp), "--out", str(tmp_path / "o"), "--plain", "--otlp-endpoint", receiver,
                    state=state_dir)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, out + err
    s = json.loads((tmp_path / "o" / "summary.json").read_text())
    spans = _spans()
    by_name = {sp.name: sp for sp in spans}
    run = by_name["chaoskit run otlp-run"]
    assert len({sp.trace_id for sp in spans}) == 1 and run.parent_span_id == b""
    phases = [sp for sp in spans if sp.name.startswith("phase ")]
    assert {"phase method", "phase rollback", "phase hypothesis_after"} <= {p.name for p in phases}
    assert all(p.parent_span_id == run.span_id for p in phases)
    fault = by_name["fault freeze"]
    assert fault.parent_span_id == by_name["phase method"].span_id
    f = s["faults"][0]
    assert fault.start_time_unix_nano == round(f["applied_at"] * 1e9)
    assert abs(fault.end_time_unix_nano / 1e9 - f["reverted_at"]) < 1e-5
    attrs = {a.key: a.value.string_value for a in fault.attributes}
    assert attrs["chaoskit.fault.type"] == "process.signal" and attrs["chaoskit.fault.target"] == str(sleeper.pid)
    events = [e for sp in phases for e in sp.events if e.name == "sample up"]
    assert len(events) == len(s["samples"])
    run_attrs = {a.key: a.value for a in run.attributes}
    assert run_attrs["chaoskit.verdict"].string_value == "held" and run_attrs["chaoskit.exit_code"].int_value == 0


class _Upstream(BaseHTTPRequestHandler):
    """An OpenAI-like completions server (4 SSE tokens) that keeps each request's traceparent."""

    protocol_version = "HTTP/1.1"
    seen: list[str | None] = []

    def do_POST(self) -> None:  # noqa: N802
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        self.seen.append(self.headers.get("traceparent"))
        body = b"".join(b'data: {"choices": [{"text": "t%d"}]}\n\n' % i for i in range(4)) + b"data: [DONE]\n\n"
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *_args: object) -> None:
        pass


@pytest.fixture
def upstream() -> Iterator[str]:
    _Upstream.seen = []
    yield from serve(_Upstream)


TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00"  # not sampled: the load sends it sampled


@pytest.mark.parametrize("sender", ["native", "python"])
def test_the_load_generator_sends_the_environments_traceparent_on_every_request(upstream, sender, monkeypatch):
    monkeypatch.setenv("TRACEPARENT", TRACEPARENT)
    spec = LoadSpec(url=upstream, api="openai", model="m", rate=20, duration=0.5, arrival="constant", sender=sender)
    s = asyncio.run(run_load(spec))
    assert s["sender"] == sender and s["requests"] == len(_Upstream.seen) == 10
    assert set(_Upstream.seen) == {TRACEPARENT[:-2] + "01"}
    monkeypatch.delenv("TRACEPARENT")
    _Upstream.seen = []
    asyncio.run(run_load(spec.model_copy(update={"duration": 0.1})))
    assert _Upstream.seen == [None, None]  # tracing off: no header


def test_load_flood_sends_the_runs_traceparent_from_its_helper(upstream, monkeypatch):
    """The flood's helper and its senders inherit the environment a traced run set (native sender: auto)."""
    monkeypatch.setenv("TRACEPARENT", TRACEPARENT)
    spec = Flood.Spec.model_validate({"type": "load.flood", "load": {
        "url": upstream, "api": "openai", "model": "m", "rate": 50, "arrival": "constant"}})
    inj = Flood(spec, FaultContext(lifetime_s=60))
    record = inj.apply(inj.prepare())
    try:
        deadline = time.monotonic() + 20
        while len(_Upstream.seen) < 5:
            assert time.monotonic() < deadline
            time.sleep(0.05)
    finally:
        Flood.revert(record)
    assert set(_Upstream.seen) == {TRACEPARENT[:-2] + "01"}


# the faults last 5 s: the sample (a load of 1 s sent 1 s after its worker starts, then its answers) took over 3 s
# on a busy box once (a clean-clone run of 057975d: no sample judged while the faults were in effect)
PROXIED = """\
apiVersion: chaoskit/v1
kind: Experiment
metadata: {{name: otlp-proxy}}
steadyState:
  probes:
    - name: through-proxy
      type: slo
      phases: [during]
      load: {{url: "http://127.0.0.1:{l4}", api: openai, model: m, rate: 20, duration: 1s, arrival: constant,
             timeout: 5s, sender: native}}
      expect: {{error_rate: "<= 1"}}
  during: {{every: 10s, grace: 0s}}   # one sample: its 20 requests, all while the proxies are there
method:
  - parallel:
    - name: chaos
      inject:
        type: llm.proxy
        listen: "127.0.0.1:{port}"
        upstream: "{upstream}"
        seed: 1
        faults:
          - {{type: abort, status: 503, share: 30%}}
          - {{type: truncate, after_tokens: 2, share: 50%}}
      duration: 5s
    - name: slow
      inject:
        type: network.proxy
        listen: "127.0.0.1:{l4}"
        upstream: "127.0.0.1:{port}"
        toxics: [{{type: latency, latency: 20ms}}]
      duration: 5s
"""


def test_the_proxies_record_their_faults_as_children_of_the_load_requests_traceparent(receiver, upstream, tmp_path,
                                                                                      state_dir):
    exp = write(tmp_path / "e.yaml", PROXIED.format(port=free_port(), l4=free_port(), upstream=upstream))
    proc = chaoskit("run", str(exp), "--out", str(tmp_path / "o"), "--plain", "--otlp-endpoint", receiver,
                    state=state_dir)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, out + err
    spans = _spans()
    run = next(sp for sp in spans if sp.name == "chaoskit run otlp-proxy")
    requests = {sp.span_id: sp for sp in spans if sp.name == "llm.proxy request"}
    assert requests and all(sp.trace_id == run.trace_id and sp.parent_span_id == run.span_id  # the load's header
                            for sp in requests.values())
    proxied = [sp for sp in spans if sp.name.startswith("llm.proxy ") and sp.name != "llm.proxy request"]
    assert proxied and all(sp.trace_id == run.trace_id and sp.parent_span_id in requests for sp in proxied)
    # upstream: the load's traceparent (the run span) as sent, or, for a request with faults, the proxy's span
    sent = [parse(h) for h in _Upstream.seen]
    ours = (int.from_bytes(run.trace_id, "big"), int.from_bytes(run.span_id, "big"), 1)
    via_proxy = {(ours[0], int.from_bytes(i, "big"), 1) for i in requests}
    assert set(sent) <= {ours} | via_proxy and ours in sent and set(sent) & via_proxy
    attrs = [{a.key: a.value for a in sp.attributes} for sp in proxied]
    aborts = [a for a in attrs if a["chaoskit.fault.type"].string_value == "abort"]
    cuts = [a for a in attrs if a["chaoskit.fault.type"].string_value == "truncate"]
    assert aborts and cuts, [sp.name for sp in proxied]
    req_attrs = {i: {a.key: a.value for a in sp.attributes} for i, sp in requests.items()}
    assert all(a["chaoskit.fault.applied"].bool_value and a["chaoskit.fault.share"].double_value == 0.3
               for a in aborts)
    assert all(a["chaoskit.fault.param.status"].int_value == 503 and "chaoskit.fault.param.retry_after" not in a
               for a in aborts)  # its parameters, the scalar ones (retry_after: none)
    assert all(a["chaoskit.fault.param.after_tokens"].int_value == 2 and a["chaoskit.fault.param.clean"].bool_value
               is False for a in cuts)
    answered = [a for a in req_attrs.values() if "chaoskit.proxy.answered_status" in a]
    assert len(answered) == len(aborts) and all(a["chaoskit.proxy.answered_status"].int_value == 503 for a in answered)
    applied = [a for a in cuts if a["chaoskit.fault.applied"].bool_value]
    streams = [a for a in req_attrs.values() if a["chaoskit.proxy.applied"].string_value == "truncate-1"]
    assert len(applied) == len(streams) and all(a["chaoskit.proxy.tokens_forwarded"].int_value == 2
                                                and a["chaoskit.proxy.cut"].bool_value for a in streams)
    # network.proxy: a span per connection (its first request's traceparent), per toxic drawn for it
    l4 = [sp for sp in spans if sp.name == "network.proxy latency"]
    assert l4 and all(sp.trace_id == run.trace_id and sp.parent_span_id == run.span_id for sp in l4)
    l4_attrs = {a.key: a.value for a in l4[0].attributes}
    assert l4_attrs["chaoskit.toxic.param.latency"].double_value == 0.02
    assert l4_attrs["chaoskit.toxic.stream"].string_value == "downstream"
    observed = [json.loads(line) for line in (tmp_path / "o" / "journal.jsonl").read_text().splitlines()
                if '"fault_observed"' in line]
    otlp = next(e["details"]["otlp"] for e in observed if "otlp" in e.get("details", {}))
    assert otlp["error"] is None and otlp["spans_lost"] == 0 and otlp["endpoint"] == receiver + "/v1/traces"
    # every request the probe saw fail was cut or aborted by the proxy, each on the run's trace
    s = json.loads((tmp_path / "o" / "summary.json").read_text())
    (v,) = [x["values"] for x in s["samples"] if x["probe"] == "through-proxy"]
    print(f"\nllm.proxy spans: {len(aborts)} abort, {len(applied)} of {len(cuts)} truncate applied; "
          f"network.proxy spans: {len(l4)}; the probe: "
          f"{v['requests']} requests, {v['ok']} ok, {v['errors.http_status']} http_status")
    assert v["requests"] == 20 and v["errors.connect"] == 0
    assert len(aborts) == v["errors.http_status"] and len(applied) == v["requests"] - v["ok"] - len(aborts)


def _abort_one_traced_request(port: int) -> None:
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", data=b"{}", method="POST",
                                 headers={"traceparent": TRACEPARENT[:-2] + "01"})
    with pytest.raises(urllib.error.HTTPError, match="503"):
        urllib.request.urlopen(req, timeout=5)


@pytest.mark.parametrize("endpoint", ["closed", "silent"])
def test_a_dead_endpoint_neither_breaks_the_proxy_nor_holds_up_its_revert(endpoint, upstream, monkeypatch):
    """closed: the export is refused (the proxy says why in its stats once the exporter gave up retrying);
    silent: a port that accepts and never answers. Neither has accepted a span, so the revert waits for none."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    if endpoint == "silent":
        sock.listen(16)
    monkeypatch.setenv("CHAOSKIT_OTLP_ENDPOINT", f"http://127.0.0.1:{sock.getsockname()[1]}/v1/traces")
    port = free_port()
    inj = LlmProxy(LlmProxy.Spec(type="llm.proxy", listen=f"127.0.0.1:{port}", upstream=upstream[7:],
                                 faults=[{"type": "abort", "status": 503}]))
    inj.ctx.lifetime_s = 60
    rec = inj.apply(inj.prepare())
    try:
        _abort_one_traced_request(port)
        if endpoint == "closed":
            deadline = time.monotonic() + 5
            while (otlp := getattr(stats_of(f"127.0.0.1:{port}"), "otlp", None)) is None or otlp.error is None:
                assert time.monotonic() < deadline, otlp
                time.sleep(0.05)
            assert otlp.spans_lost == 1 and otlp.spans_exported == 0, otlp
            _abort_one_traced_request(port)  # still serving
        t = time.monotonic()
    finally:
        LlmProxy.revert(rec)
        sock.close()
    took = time.monotonic() - t
    print(f"\nrevert with a {endpoint} OTLP endpoint: {took * 1000:.0f} ms")
    assert not LlmProxy.observe(rec) and took < 0.3
