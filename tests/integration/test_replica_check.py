"""The after phase's replica check names a replica that died while it was being checked (its connection closed
as its process exited) as not running, not as a replica that did not answer: a real process on loopback."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from collections.abc import Iterator

import pytest

from chaoskit.reference.httpcheck import http_status
from chaoskit.reference.replica_check import EXIT_GRACE_S, ReplicaCheck
from tests.conftest import free_port, wait_for

# Answers GETs; a POST (the 1-token check) closes the connection at once, then the process exits `delay` later
SERVER = textwrap.dedent("""\
    import http.server, os, sys, threading, time
    delay = float(sys.argv[2])
    class H(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200); self.end_headers()
        def do_POST(self):
            self.connection.close()
            threading.Thread(target=lambda: (time.sleep(delay), os._exit(0))).start()
        def log_message(self, *a):
            pass
    http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
""")


@pytest.fixture
def dying(request) -> Iterator[tuple[subprocess.Popen, str]]:
    port = free_port()
    p = subprocess.Popen([sys.executable, "-c", SERVER, str(port), str(request.param)])
    url = f"http://127.0.0.1:{port}"
    wait_for(lambda: http_status(url, timeout=1) == 200)
    yield p, url
    p.kill()
    p.wait()


def _check(p: subprocess.Popen, url: str) -> ReplicaCheck:
    return ReplicaCheck({"engine": "triton", "replicas": [{"name": "r0", "url": url, "pid": p.pid}]})


@pytest.mark.parametrize("dying", [0.1], indirect=True)
def test_a_replica_that_exits_during_its_check_is_not_running(dying):
    p, url = dying
    problems = _check(p, url)()
    assert len(problems) == 1 and problems[0].startswith(f"r0: process not running (PID {p.pid} "), problems


@pytest.mark.parametrize("dying", [EXIT_GRACE_S + 2], indirect=True)
def test_a_live_replica_that_closed_the_connection_is_not_ready(dying):
    p, url = dying
    problems = _check(p, url)()
    assert len(problems) == 1 and problems[0].startswith("r0: not ready (POST /v2/models/"), problems
    assert "no answer" in problems[0] and p.poll() is None
