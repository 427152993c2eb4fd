"""The run's proxy forkserver: a forked proxy helper is what proxy_proc would start (its own session, its token in
its command line, found and stopped by it), outlives the forkserver, and the forkserver ends with its run."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import uuid

import psutil
import pytest

from chaoskit.injectors import helper_proc
from chaoskit.injectors.base import FaultContext
from chaoskit.injectors.forkserver.client import Forkserver
from chaoskit.injectors.proxy.fault import Proxy
from chaoskit.targets.process import cmdline, find_by_token
from tests.conftest import wait_for
from tests.helpers.netpair import serve_in_threads

SERVER = "chaoskit.injectors.proxy.server"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def echo():
    sock = socket.create_server(("127.0.0.1", 0))

    def one(conn: socket.socket) -> None:
        with conn:
            while data := conn.recv(1 << 16):
                conn.sendall(data)

    close = serve_in_threads(sock, one)
    yield sock.getsockname()[1]
    close()


def echoes(port: int) -> bool:
    with socket.create_connection(("127.0.0.1", port), timeout=5) as c:
        c.sendall(b"ping")
        return c.recv(4) == b"ping"


def args(port: int, up: int) -> list[str]:
    return [SERVER, f"127.0.0.1:{port}", f"127.0.0.1:{up}", "[]", f"{time.time() + 60:.3f}"]


def test_forked_helpers_serve_carry_their_token_and_outlive_the_forkserver(echo):
    """Each is what proxy_proc would start: its token in its command line, its own session, the interpreter's
    name, standard streams on /dev/null (no socket of the forkserver's)."""
    fs = Forkserver()
    helpers = []
    try:
        for _ in range(3):
            token, port = f"chaoskit-proxy-{uuid.uuid4().hex}", free_port()
            helpers.append((token, fs.spawn(token, args(port, echo), "proxy"), port))
        server = psutil.Process(helpers[0][1].pid).parent()
        assert any(a.endswith("chaoskit/injectors/forkserver/main.py") for a in server.cmdline())
        for token, ref, port in helpers:
            assert [r.pid for r in find_by_token(token)] == [ref.pid] and ref.start_time
            assert os.getsid(ref.pid) == ref.pid  # its own session, as a helper proxy_proc started
            assert cmdline(ref.pid)[1:4] == [token, SERVER, f"127.0.0.1:{port}"]
            assert psutil.Process(ref.pid).name() == psutil.Process().name()  # python3.x, not the title
            assert [os.readlink(f"/proc/{ref.pid}/fd/{fd}") for fd in (0, 1, 2)] == ["/dev/null"] * 3
            assert echoes(port)
        fs.close()
        assert not server.is_running()
        assert all(helper_proc.running(t, r) and echoes(p) for t, r, p in helpers)
    finally:
        fs.close()
        helper_proc.stop_all([r for _, r, _ in helpers])
    assert not any(helper_proc.running(t, r) for t, r, _ in helpers)


def test_a_helper_that_cannot_listen_says_why_and_the_forkserver_goes_on(echo):
    fs = Forkserver()
    taken = socket.create_server(("127.0.0.1", 0))
    try:
        with pytest.raises(RuntimeError, match=r"proxy on x failed to start: cannot listen on 127\.0\.0\.1:\d+: "
                                               r"\[Errno 98\] Address already in use"):
            fs.spawn(f"chaoskit-proxy-{uuid.uuid4().hex}", args(taken.getsockname()[1], echo), "proxy on x")
        token, port = f"chaoskit-proxy-{uuid.uuid4().hex}", free_port()
        ref = fs.spawn(token, args(port, echo), "proxy")
        assert echoes(port)
        helper_proc.stop(token, ref=ref)
    finally:
        taken.close()
        fs.close()


def test_a_proxy_fault_in_a_run_is_forked_and_reverted_by_its_record(echo):
    fs = Forkserver()
    port = free_port()
    inj = Proxy(Proxy.Spec(type="network.proxy", listen=f"127.0.0.1:{port}", upstream=f"127.0.0.1:{echo}"),
                FaultContext(forkserver=fs))
    try:
        rec = inj.apply(inj.prepare())
        assert "forkserver/main.py" in " ".join(psutil.Process(rec.proxy.pid).parent().cmdline())
        assert echoes(port) and Proxy.observe(rec)
        Proxy.revert(rec)  # as a fresh process would: from the record alone
        assert not Proxy.observe(rec)
    finally:
        fs.close()


KILLED_RUN = """
import sys, time
from chaoskit.injectors.forkserver.client import Forkserver
fs = Forkserver()
ref = fs.spawn(sys.argv[1], sys.argv[2:], "proxy")
print(ref.pid, flush=True)
time.sleep(60)
"""


def test_a_killed_run_takes_its_forkserver_down_and_leaves_the_helper_to_the_watchdog(echo):
    token, port = f"chaoskit-proxy-{uuid.uuid4().hex}", free_port()
    run = subprocess.Popen([sys.executable, "-c", KILLED_RUN, token, *args(port, echo)], stdout=subprocess.PIPE,
                           text=True)
    try:
        helper = int(run.stdout.readline())
        server = psutil.Process(helper).ppid()
        assert "forkserver/main.py" in " ".join(psutil.Process(server).cmdline())
        run.send_signal(signal.SIGKILL)
        run.wait()
        took = wait_for(lambda: not psutil.pid_exists(server) or psutil.Process(server).status() == "zombie",
                        timeout=5)
        assert took < 1.0
        assert [r.pid for r in find_by_token(token)] == [helper] and echoes(port)
    finally:
        run.kill()
        run.stdout.close()
        helper_proc.stop(token)
    assert not find_by_token(token)


def test_a_forkserver_killed_mid_run_is_started_again_at_the_next_spawn(echo):
    fs = Forkserver()
    tokens = [f"chaoskit-proxy-{uuid.uuid4().hex}" for _ in range(2)]
    try:
        first = fs.spawn(tokens[0], args(free_port(), echo), "proxy")
        server = psutil.Process(first.pid).parent()
        server.kill()
        server.wait(5)
        port = free_port()
        second = fs.spawn(tokens[1], args(port, echo), "proxy")
        assert psutil.Process(second.pid).ppid() != server.pid and echoes(port)
    finally:
        fs.close()
        for token in tokens:
            helper_proc.stop(token)


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root: creates a network namespace")
def test_a_forked_intercept_proxy_listens_in_its_namespace_and_the_next_in_ours(echo):
    name = f"chaoskit-t-fs-{uuid.uuid4().hex[:8]}"
    subprocess.run(["ip", "netns", "add", name], check=True)
    fs = Forkserver()
    tokens = [f"chaoskit-proxy-{uuid.uuid4().hex}" for _ in range(2)]
    try:
        path = f"/run/netns/{name}"
        inside = fs.spawn(tokens[0], args(free_port(), echo), "proxy", {"CHAOSKIT_PROXY_NETNS": path})
        port = free_port()
        outside = fs.spawn(tokens[1], args(port, echo), "proxy")
        ns = os.stat(path).st_ino
        assert os.stat(f"/proc/{inside.pid}/ns/net").st_ino == ns
        assert os.stat(f"/proc/{outside.pid}/ns/net").st_ino == os.stat("/proc/self/ns/net").st_ino != ns
        assert echoes(port)
    finally:
        fs.close()
        for token in tokens:
            helper_proc.stop(token)
        subprocess.run(["ip", "netns", "delete", name], check=True)


def test_a_forkserver_that_does_not_answer_fails_the_spawn_in_its_timeout(echo):
    """The spawn fails within its timeout; the helper forked late for it finds nobody waiting and exits."""
    fs = Forkserver(timeout_s=0.5)
    fs.start()
    token = f"chaoskit-proxy-{uuid.uuid4().hex}"
    first = fs.spawn(f"chaoskit-proxy-{uuid.uuid4().hex}", args(free_port(), echo), "proxy")
    server = psutil.Process(first.pid).parent()
    server.suspend()
    try:
        t0 = time.monotonic()
        with pytest.raises(RuntimeError, match=r"proxy: no answer from the proxy forkserver in 0\.5s"):
            fs.spawn(token, args(free_port(), echo), "proxy")
        assert time.monotonic() - t0 < 2.0
    finally:
        server.resume()
        fs.close()
        helper_proc.stop(cmdline(first.pid)[1])
    # the late request is served once the forkserver runs again: its helper finds nobody waiting and exits (the
    # pause gives the forkserver time to fork it; on a busy box the exit may come later)
    time.sleep(0.5)
    wait_for(lambda: not find_by_token(token), timeout=10)
