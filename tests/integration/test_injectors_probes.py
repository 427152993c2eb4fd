"""Real injectors and probes: memory holder RSS, process.signal by name, http probe against a live server,
safeguard abort, preflight refusal, and a revert that fails loudly (exit 5)."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from chaoskit.engine.ledger import Ledger
from chaoskit.errors import PreflightError
from chaoskit.injectors.memory.pressure import MemoryPressure, MemoryPressureSpec
from chaoskit.injectors.process.fault import ProcessSignal, ProcessSignalSpec, descendants
from chaoskit.probes.http import HttpProbe, HttpProbeSpec
from chaoskit.targets.process import ProcessRef, is_alive, proc_ref
from tests.conftest import chaoskit, ledgers, proc_state, wait_for, write


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def test_memory_pressure_holds_and_releases():
    inj = MemoryPressure(MemoryPressureSpec(type="host.memory_pressure", size="64MiB"))
    inj.preflight()
    record = inj.prepare()
    final = inj.apply(record)
    try:
        pid = final.holder.pid
        assert rss_bytes(pid) >= 60 * 1024 * 1024, "holder did not touch its pages"
        assert MemoryPressure.observe(final)
    finally:
        MemoryPressure.revert(final)
    assert not MemoryPressure.observe(final)
    MemoryPressure.revert(final)  # idempotent
    MemoryPressure.revert(record)  # from the pre-apply record alone, too


def test_memory_pressure_refuses_unsafe_sizes():
    with pytest.raises(PreflightError, match="allow_unsafe"):
        MemoryPressure(MemoryPressureSpec(type="host.memory_pressure", size="95%")).preflight()


@pytest.fixture
def stray_sleep() -> Iterator[ProcessRef]:
    """A `sleep` that is not this test's descendant (its parent shell exits at once: it is reparented)."""
    out = subprocess.run(["sh", "-c", "sleep 600 >/dev/null 2>&1 & echo $!"], capture_output=True, text=True,
                         check=True).stdout
    ref = proc_ref(int(out))
    assert ref is not None and ref.pid not in {r.pid for r in descendants(os.getpid())}
    yield ref
    if is_alive(ref):
        os.kill(ref.pid, signal.SIGKILL)


def test_process_signal_by_name_and_guards(sleeper, stray_sleep):
    # by name among this test's own children only: never another job's `sleep` on a shared host (stray_sleep)
    spec = ProcessSignalSpec(type="process.signal", name="^sleep$", child_of=os.getpid(), select="all")
    inj = ProcessSignal(spec)
    prepared = inj.prepare()
    # checked before anything is sent: a child_of that stopped narrowing would SIGSTOP every `sleep` on the host
    assert prepared.targets == [proc_ref(sleeper.pid)], prepared
    record = inj.apply(prepared)
    try:
        assert [t.pid for t in record.targets] == [sleeper.pid]
        assert proc_state(sleeper.pid) == "T" and ProcessSignal.observe(record)
    finally:
        ProcessSignal.revert(record)
    wait_for(lambda: proc_state(sleeper.pid) in ("S", "R"), timeout=2)  # just continued: may still be running
    assert proc_state(stray_sleep.pid) == "S"
    with pytest.raises(PreflightError, match="refusing"):
        ProcessSignal(ProcessSignalSpec(type="process.signal", pid=1)).preflight()
    with pytest.raises(PreflightError, match="no running process"):
        ProcessSignal(ProcessSignalSpec(type="process.signal", name="^no-such-process-xyz$")).preflight()


class _Handler(BaseHTTPRequestHandler):
    latency_ms = "120.5"

    def do_GET(self) -> None:  # noqa: N802
        body = json.dumps({"ready": True, "models": [{"name": "tiny_lm"}]}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("X-Model-Latency", self.latency_ms)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def server():
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    yield f"http://127.0.0.1:{srv.server_address[1]}"
    srv.shutdown()
    srv.server_close()


def test_http_probe_headers_and_json(server):
    from chaoskit.engine.steady_state import take_sample

    async def sample(expect):
        probe = HttpProbe(HttpProbeSpec(name="p", type="http", url=server + "/ready", expect=expect))
        try:
            return await take_sample(probe, "before")
        finally:
            await probe.close()

    ok = asyncio.run(sample({"status": 200, "headers": {"x-model-latency": "< 950"},
                             "json": {"ready": True, "models[0].name": "tiny_lm"}}))
    assert ok.verdict == "ok", ok.details
    slow = asyncio.run(sample({"headers": {"X-Model-Latency": "< 100"}}))
    assert slow.verdict == "fail" and "120.5 < 100 is false" in slow.details[0]
    missing = asyncio.run(sample({"json": {"nope": 1}}))
    assert missing.verdict == "fail"


def test_http_probe_connection_refused_is_an_error_result():
    from chaoskit.engine.steady_state import take_sample

    probe = HttpProbe(HttpProbeSpec(name="p", type="http", url="http://127.0.0.1:9/", timeout="1s"))
    s = asyncio.run(take_sample(probe, "during"))
    asyncio.run(probe.close())
    assert s.verdict == "error" and s.error


SAFEGUARD = """\
apiVersion: chaoskit/v1
kind: Experiment
metadata: {name: safeguard}
steadyState:
  probes:
    - name: fast
      type: http
      url: "URL/"
      timeout: 300ms
      expect: {status: 200}
  during: {every: 200ms}
method:
  - inject: {type: process.signal, pid: "{pid}"}
    duration: 30s
safeguards:
  - probe: fast
    abort_when: "status != 200"
    on_error: abort
"""


def test_safeguard_aborts_within_one_interval(tmp_path, state_dir, server):
    """The fault stops a sleeper; mid-run the live server starts answering 500 and the safeguard must abort
    within one probe interval (exit 3), with the fault reverted."""
    target = subprocess.Popen(["sleep", "600"])
    try:
        exp = write(tmp_path / "e.yaml", SAFEGUARD.replace("URL", server))
        run = chaoskit("run", str(exp), "--var", f"pid={target.pid}", "--out", str(tmp_path / "o"), state=state_dir)
        journal = tmp_path / "o" / "journal.jsonl"
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline and not (journal.exists() and "fault_applied" in journal.read_text()):
            time.sleep(0.02)
        assert proc_state(target.pid) == "T"
        t_break = time.time()
        _Handler.do_GET = _status_500  # type: ignore[method-assign]
        out, err = run.communicate(timeout=30)
        assert run.returncode == 3, out + err
        trip = next(e for e in map(json.loads, journal.read_text().splitlines()) if e["event"] == "safeguard")
        assert "status" in trip["reason"]
        assert trip["t"] - t_break < 0.2 + 0.3, "safeguard slower than one interval (+ one probe)"
        assert proc_state(target.pid) == "S"
    finally:
        _Handler.do_GET = _ORIGINAL_GET  # type: ignore[method-assign]
        target.kill()
        target.wait()


_ORIGINAL_GET = _Handler.do_GET


def _status_500(self: BaseHTTPRequestHandler) -> None:
    self.send_response(500)
    self.send_header("Content-Length", "0")
    self.end_headers()


def test_preflight_failure_exits_4_and_applies_nothing(tmp_path, state_dir):
    exp = write(tmp_path / "e.yaml", """\
apiVersion: chaoskit/v1
kind: Experiment
metadata: {name: pf}
steadyState:
  probes: [{name: t, type: command, argv: ["true"]}]
method:
  - inject: {type: process.signal, name: "^no-such-process-xyz$"}
    duration: 1s
""")
    run = chaoskit("run", str(exp), "--out", str(tmp_path / "o"), state=state_dir)
    out, err = run.communicate(timeout=30)
    assert run.returncode == 4, out + err
    assert "no running process matches" in out + err
    assert ledgers(state_dir) == []


def test_failed_revert_is_loud_and_kept(tmp_path, state_dir):
    """A ledger entry nobody can revert (written by a newer chaoskit): exit 5, ledger stays open."""
    ledger = Ledger.create("future-run", "x", state_dir / "ledgers")
    ledger.intent("network.quantum_entangle", {"x": 1}, ["entangle"])
    # the owner (this test process) is alive, so --force is needed
    rb = chaoskit("rollback", "--ledger", str(ledger.path), "--force", state=state_dir)
    out, err = rb.communicate(timeout=60)
    assert rb.returncode == 5, out + err
    assert "FAILED #1 network.quantum_entangle" in err and "unknown fault type" in err
    assert not ledger.read().closed and len(ledger.read().entries[1].failures) == 3
