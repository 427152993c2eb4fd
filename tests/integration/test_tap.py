"""The counting pass-through between a gateway and a replica (chaoskit.reference.tap), against a real tiny-openai
replica: it relays unchanged and logs each request when it reached the replica's door, also while the replica is
frozen (whose own log shows the request only once thawed) or gone."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from chaoskit.reference.tiny_tools import tokens
from tests.conftest import free_port, wait_for


def listening(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
        return True
    except OSError:
        return False


@pytest.fixture
def pair(tmp_path: Path) -> Iterator[tuple[subprocess.Popen, int, Path, Path, int]]:
    """(the replica's process, the tap's port, the replica's log, the tap's log, the port of its counters)."""
    replica_port, tap_port, metrics_port = free_port(), free_port(), free_port()
    replica_log, tap_log = tmp_path / "replica.jsonl", tmp_path / "tap.jsonl"
    replica = subprocess.Popen([sys.executable, "-m", "chaoskit.reference.tiny_openai", "--port", str(replica_port),
                                "--name", "r0", "--log", str(replica_log)])
    tap = subprocess.Popen([sys.executable, "-m", "chaoskit.reference.tap", "--log", str(tap_log),
                            f"--route=r0={tap_port}=127.0.0.1:{replica_port}", f"--metrics={metrics_port}"],
                           stdout=subprocess.DEVNULL)
    try:
        wait_for(lambda: listening(replica_port) and listening(tap_port) and listening(metrics_port), timeout=20,
                 every=0.1)
        yield replica, tap_port, replica_log, tap_log, metrics_port
    finally:
        for p in (tap, replica):
            if p.poll() is None:
                os.kill(p.pid, signal.SIGCONT)
                p.terminate()
                p.wait(10)


def complete(port: int, prompt: str, timeout: float = 10, stream: bool = False) -> bytes:
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", method="POST",
                                 data=json.dumps({"prompt": prompt, "max_tokens": 4, "stream": stream}).encode())
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return r.read()


def lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def test_the_tap_relays_unchanged_and_logs_each_answer(pair) -> None:
    _, port, _, tap_log, metrics = pair
    assert json.loads(complete(port, "one"))["choices"][0]["text"] == "".join(tokens("one", 4))
    streamed = complete(port, "two", stream=True).decode()
    assert streamed.endswith("data: [DONE]\n\n") and streamed.count("data: ") == 5
    wait_for(lambda: len(lines(tap_log)) == 2, timeout=5)
    assert [(x["path"], x["status"], x["outcome"]) for x in lines(tap_log)] == \
        [("/v1/completions", 200, "complete")] * 2
    # the same counts on its Prometheus endpoint (a gateway's upstream attempts, for a prometheus probe)
    with urllib.request.urlopen(f"http://127.0.0.1:{metrics}/metrics", timeout=5) as r:
        samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
                   for f in text_string_to_metric_families(r.read().decode()) for s in f.samples}
    assert samples[("chaoskit_tap_requests_total", (("path", "/v1/completions"), ("replica", "r0")))] == 2
    assert samples[("chaoskit_tap_answers_total", (("outcome", "complete"), ("path", "/v1/completions"),
                                                   ("replica", "r0"), ("status", "200")))] == 2
    with pytest.raises(urllib.error.HTTPError, match="404"):
        urllib.request.urlopen(f"http://127.0.0.1:{metrics}/other", timeout=5)


def test_a_request_to_a_frozen_replica_is_logged_when_it_arrived(pair) -> None:
    replica, port, replica_log, tap_log, _ = pair
    complete(port, "warm")
    os.kill(replica.pid, signal.SIGSTOP)
    sent = time.time()
    with pytest.raises((TimeoutError, urllib.error.URLError)):
        complete(port, "frozen", timeout=1.0)
    thawed = time.time()
    os.kill(replica.pid, signal.SIGCONT)
    wait_for(lambda: len(lines(replica_log)) == 2 and len(lines(tap_log)) == 2, timeout=10)
    at_tap, at_replica = lines(tap_log)[1], lines(replica_log)[1]
    assert sent <= at_tap["t"] < sent + 0.5, at_tap  # at the door at once
    assert at_tap["status"] == 0 and at_tap["outcome"] == "gateway_closed", at_tap
    assert at_replica["t0"] >= thawed, at_replica  # the replica saw it only once thawed


def test_a_request_to_a_dead_replica_is_logged_as_refused(pair) -> None:
    replica, port, _, tap_log, _ = pair
    replica.kill()
    replica.wait(5)
    with pytest.raises((urllib.error.URLError, ConnectionError, OSError)):
        complete(port, "dead", timeout=5)
    wait_for(lambda: len(lines(tap_log)) == 1, timeout=5)
    assert [(x["path"], x["outcome"]) for x in lines(tap_log)] == [("/v1/completions", "refused")]


def test_a_request_to_a_replica_that_answers_no_syn_is_logged_when_it_arrived(tmp_path: Path) -> None:
    """A replica cut off by the network: here a listener whose accept queue is full, so the kernel drops the
    tap's SYN (loopback only); the request is logged as it arrives, not once a connection is made."""
    full = socket.socket()
    full.bind(("127.0.0.1", 0))
    full.listen(0)
    port = full.getsockname()[1]
    fillers = []
    for _ in range(4):  # fill the accept queue: later SYNs get no answer
        s = socket.socket()
        s.setblocking(False)
        s.connect_ex(("127.0.0.1", port))
        fillers.append(s)
    time.sleep(0.2)
    tap_port, tap_log = free_port(), tmp_path / "tap.jsonl"
    tap = subprocess.Popen([sys.executable, "-m", "chaoskit.reference.tap", "--log", str(tap_log),
                            f"--route=r0={tap_port}=127.0.0.1:{port}"], stdout=subprocess.DEVNULL)
    try:
        wait_for(lambda: listening(tap_port), timeout=20, every=0.1)
        sent = time.time()
        with pytest.raises((TimeoutError, urllib.error.URLError)):
            complete(tap_port, "cut off", timeout=1.0)
        wait_for(lambda: len(lines(tap_log)) == 1, timeout=5)
        [logged] = lines(tap_log)
        assert sent <= logged["t"] < sent + 0.5 and logged["path"] == "/v1/completions", logged
        assert logged["outcome"] == "gateway_closed", logged
    finally:
        tap.terminate()
        tap.wait(10)
        for s in (*fillers, full):
            s.close()
