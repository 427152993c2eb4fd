"""`chaoskit run --otlp-endpoint`: an in-test OTLP/HTTP receiver decodes what the run exported (opentelemetry-proto):
one trace, a span for the run, each phase and the fault (its window exactly the journal's), samples as events."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

pb = pytest.importorskip("opentelemetry.proto.collector.trace.v1.trace_service_pb2")

from tests.conftest import chaoskit, write  # noqa: E402

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


@pytest.fixture
def receiver() -> Iterator[str]:
    _Receiver.got = []
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _Receiver)
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{srv.server_address[1]}"
    srv.shutdown()
    srv.server_close()
    thread.join(2)


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
