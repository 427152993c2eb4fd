"""`chaoskit run` on bundled experiments, as is, by name (with and without .yaml), against a real local HTTP
server."""

from __future__ import annotations

import json
import socket
import subprocess
import sys

import pytest

from tests.conftest import chaoskit, free_port, proc_state, wait_for


@pytest.fixture
def http_server(tmp_path):
    port = free_port()
    (tmp_path / "index.html").write_text("ok")
    proc = subprocess.Popen([sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1",
                             "--directory", str(tmp_path)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def up() -> bool:
        try:
            socket.create_connection(("127.0.0.1", port), 0.2).close()
            return True
        except OSError:
            return False

    wait_for(up, timeout=10)
    yield proc, port
    proc.kill()
    proc.wait()


def test_stop_http_server_is_detected_and_recovers(tmp_path, state_dir, http_server):
    proc, port = http_server
    run = chaoskit("run", "basic/stop-http-server", "--var", f"port={port}",
                   "--out", str(tmp_path / "o"), "--junit", str(tmp_path / "j.xml"), state=state_dir)
    out, err = run.communicate(timeout=60)
    assert run.returncode == 1, out + err  # the frozen server is the deviation this experiment exists to show
    s = json.loads((tmp_path / "o" / "summary.json").read_text())
    assert s["verdict"] == "deviated" and s["rollback_complete"] and s["recovery_s"] is not None
    assert any(x["phase"] == "during" and x["verdict"] != "ok" for x in s["samples"])
    assert proc_state(proc.pid) in ("S", "R")
    assert 'failures="1"' in (tmp_path / "j.xml").read_text()


def test_memory_pressure_holds(tmp_path, state_dir, http_server):
    _, port = http_server
    run = chaoskit("run", "basic/memory-pressure.yaml", "--var", f"port={port}", "--var", "size=64MiB",
                   "--out", str(tmp_path / "o"), state=state_dir)
    out, err = run.communicate(timeout=60)
    assert run.returncode == 0, out + err
    s = json.loads((tmp_path / "o" / "summary.json").read_text())
    fault = s["faults"][0]
    assert fault["type"] == "host.memory_pressure" and fault["reverted_at"]
    # the memory was really held while the fault was in effect (the holder's own count, observed before revert)
    observed = fault["observed_before_revert"]
    assert observed["in_effect"] and observed["held"] >= 64 * 1024 * 1024, observed
    assert "chaoskit-holder" not in subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout
