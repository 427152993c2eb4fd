"""Transparent interception (network.proxy / llm.proxy `intercept`): a client in one namespace, the service in
another; the redirect and the proxy go into the service's namespace. Connections open before, during and after."""

from __future__ import annotations

import http.client
import json
import os
import socket
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from threading import Thread

import pytest

from chaoskit.injectors.base import FaultContext
from chaoskit.injectors.llm_proxy.fault import LlmProxy
from chaoskit.injectors.proxy import intercept as proxy_intercept
from chaoskit.injectors.proxy.fault import Proxy
from chaoskit.reference.deploy import Deployment, RefOptions
from chaoskit.targets.netns import run_in_netns
from chaoskit.targets.process import all_pids, cmdline
from tests.conftest import requires_triton, wait_for
from tests.helpers.netpair import CLIENT_IP, SERVER_IP, Pair, serve_in_threads, sh

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="network namespaces and nftables need root")
PORT = 8000


class Echo:
    """Echo server on SERVER_IP:PORT in the server namespace; answers each line with 'PEER-IP LINE'."""

    def __init__(self, ns: str):
        self.sock = run_in_netns(ns, lambda: socket.create_server(("0.0.0.0", PORT)))
        self.close = serve_in_threads(self.sock, self._one)

    def _one(self, conn: socket.socket) -> None:
        peer = conn.getpeername()[0].encode()
        with conn:
            try:
                while data := conn.recv(4096):
                    conn.sendall(peer + b" " + data)
            except OSError:
                pass


@pytest.fixture
def net():
    p = Pair()
    echo = Echo(p.path(p.srv))
    yield p
    echo.close()
    p.close()


def connect(p: Pair) -> socket.socket:
    s = run_in_netns(p.path(p.cli), lambda: socket.create_connection((SERVER_IP, PORT), timeout=5))
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return s


def ask(s: socket.socket) -> tuple[str, float]:
    """(the peer address the server saw, round-trip seconds)."""
    t0 = time.monotonic()
    s.sendall(b"hi")
    got = s.recv(4096)
    return got.decode().split()[0], time.monotonic() - t0


def http_answer(s: socket.socket) -> bytes:
    """One whole HTTP/1.1 answer (head, then Content-Length bytes of body), however the segments fell."""
    data = b""
    while b"\r\n\r\n" not in data and (chunk := s.recv(4096)):
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = next((int(ln.split(b":", 1)[1]) for ln in head.split(b"\r\n")
                   if ln.lower().startswith(b"content-length:")), 0)
    while len(body) < length and (chunk := s.recv(4096)):
        body += chunk
    return head + b"\r\n\r\n" + body


def closed(s: socket.socket) -> bool:
    try:
        s.sendall(b"hi")
        return s.recv(4096) == b""
    except OSError:
        return True


def test_intercept_redirects_new_connections_only_and_revert_restores_them(net):
    before = net.ruleset(net.srv)
    old = connect(net)
    assert ask(old)[0] == CLIENT_IP
    inj = Proxy(Proxy.Spec(type="network.proxy", intercept={"port": PORT, "target": {"netns": net.srv}},
                           toxics=[{"type": "latency", "latency": "40ms"}]))
    inj.preflight()
    assert "intercepting port 8000" in inj.plan()[0] and "already open are not touched" in inj.plan()[0]
    rec = inj.apply(inj.prepare())
    try:
        assert rec.table and rec.proxy and rec.ns == net.path(net.srv)  # the ledger's record: both
        new = connect(net)
        peer, rtt = ask(new)
        assert peer == SERVER_IP and rtt >= 0.04  # through the proxy (it connects from inside the namespace)
        peer, rtt = ask(old)
        assert peer == CLIENT_IP and rtt < 0.03  # open before the rule: straight to the server, no toxic
        assert Proxy.observe(rec)
    finally:
        Proxy.revert(rec)
    assert not Proxy.observe(rec) and net.ruleset(net.srv) == before
    assert not [p for p in all_pids() if rec.token in cmdline(p)]
    assert closed(new)  # carried by the proxy: closed when it stopped
    assert ask(old)[0] == CLIENT_IP  # untouched throughout
    after = connect(net)
    peer, rtt = ask(after)
    assert peer == CLIENT_IP and rtt < 0.03  # straight to the server again
    Proxy.revert(rec)  # idempotent


class _Peer(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_GET(self) -> None:  # noqa: N802
        body = self.client_address[0].encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def http_net():
    """The pair with an HTTP server on SERVER_IP:PORT answering each GET with the peer address it saw."""
    p = Pair()
    srv = ThreadingHTTPServer(("0.0.0.0", PORT), _Peer, bind_and_activate=False)
    srv.socket.close()
    srv.socket = run_in_netns(p.path(p.srv), lambda: socket.create_server(("0.0.0.0", PORT)))
    srv.daemon_threads = True
    Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    yield p
    srv.shutdown()
    srv.server_close()
    p.close()


def test_llm_proxy_intercepts_http_and_answers_its_stats_in_the_namespace(http_net):
    """llm.proxy on the service's port: a matching request aborted, another forwarded to where it was going."""
    net = http_net
    inj = LlmProxy(LlmProxy.Spec(type="llm.proxy", intercept={"port": PORT, "target": {"netns": net.srv}},
                                 faults=[{"type": "abort", "status": 503, "match": {"path": "/v1/*"}}]))
    inj.preflight()
    rec = inj.apply(inj.prepare())
    try:
        s = connect(net)
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}")
        assert http_answer(s).startswith(b"HTTP/1.1 503")
        s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        got = http_answer(s)
        assert got.startswith(b"HTTP/1.1 200") and got.endswith(SERVER_IP.encode())  # forwarded by the proxy
        s.close()
        details = LlmProxy.observe_details(rec)
        assert details["in_effect"] and details["faults"]["abort-0"]["applied"] == 1
        assert json.dumps(details)  # journal-able
    finally:
        LlmProxy.revert(rec)
    assert not LlmProxy.observe(rec)


def test_a_proxy_ending_by_itself_takes_its_redirect_with_it(net):
    """Its lifetime over with no revert (the run and its watchdog gone): the redirect is deleted before the
    proxy stops listening, so the port is never left redirecting to a closed one."""
    inj = Proxy(Proxy.Spec(type="network.proxy", intercept={"port": PORT, "target": {"netns": net.srv}}),
                FaultContext(lifetime_s=0.5))
    rec = inj.apply(inj.prepare())
    try:
        assert ask(connect(net))[0] == SERVER_IP  # through the proxy
        wait_for(lambda: not Proxy.observe(rec), timeout=10)  # neither the table nor the helper is left
        assert net.ruleset(net.srv) == [] and ask(connect(net))[0] == CLIENT_IP
    finally:
        Proxy.revert(rec)


SERVER_IP6, CLIENT_IP6 = "fd00:211::1", "fd00:211::2"


def test_intercept_takes_ipv6_and_ipv4_connections_to_their_own_destinations(net):
    """With IPv6 on the veth too and the echo server listening on both: `existing: reset` resets the connections
    of either family open at apply; a new connection of either family goes through the proxy (the latency toxic,
    and the server sees the proxy's address in the namespace) to its own original destination; after revert both
    go straight again."""
    for ns, ip in ((net.srv, SERVER_IP6), (net.cli, CLIENT_IP6)):
        sh("ip", "-n", ns, "addr", "add", f"{ip}/64", "dev", "eth0", "nodad")
    six = Echo.__new__(Echo)
    six.sock = run_in_netns(net.path(net.srv), lambda: socket.create_server((SERVER_IP6, PORT), family=socket.AF_INET6))
    six.close = serve_in_threads(six.sock, six._one)

    def connect6() -> socket.socket:
        return run_in_netns(net.path(net.cli), lambda: socket.create_connection((SERVER_IP6, PORT), timeout=5))

    try:
        old6, old4 = connect6(), connect(net)
        assert ask(old6)[0] == CLIENT_IP6 and ask(old4)[0] == CLIENT_IP
        inj = Proxy(Proxy.Spec(type="network.proxy", toxics=[{"type": "latency", "latency": "40ms"}],
                               intercept={"port": PORT, "target": {"netns": net.srv}, "existing": "reset"}))
        rec = inj.apply(inj.prepare())
        try:
            assert rec.listen.startswith("[::]:") and rec.reset_connections == 2
            assert closed(old6) and closed(old4)
            for conn, proxy_ip in ((connect6, SERVER_IP6), (lambda: connect(net), SERVER_IP)):
                peer, rtt = ask(conn())
                assert peer == proxy_ip and rtt >= 0.04, (peer, rtt)
        finally:
            Proxy.revert(rec)
        assert not Proxy.observe(rec) and net.ruleset(net.srv) == []
        assert ask(connect6())[0] == CLIENT_IP6 and ask(connect(net))[0] == CLIENT_IP
    finally:
        six.close()


def test_an_apply_that_fails_after_the_redirect_leaves_neither_it_nor_the_proxy(net, monkeypatch):
    """Resetting the open connections fails (made to, here): apply raises, and has taken back the redirect and
    stopped the proxy it started (outside a run no rollback would)."""

    def fail(ns: str, port: int) -> int:
        raise OSError("ss -K failed (made to fail by the test)")

    monkeypatch.setattr(proxy_intercept, "reset_open", fail)
    inj = Proxy(Proxy.Spec(type="network.proxy", intercept={"port": PORT, "target": {"netns": net.srv},
                                                            "existing": "reset"}))
    rec = inj.prepare()
    with pytest.raises(OSError, match="made to fail"):
        inj.apply(rec)
    assert not Proxy.observe(rec) and net.ruleset(net.srv) == []
    assert not [p for p in all_pids() if rec.token in cmdline(p)]
    assert ask(connect(net))[0] == CLIENT_IP


def test_revert_deletes_a_redirect_an_older_chaoskit_made_in_an_ip_table(net):
    """Before IPv6, the redirect was an `ip` table: a record of then, reverted now, still deletes it."""
    inj = Proxy(Proxy.Spec(type="network.proxy", intercept={"port": PORT, "target": {"netns": net.srv}}))
    rec = inj.prepare()
    sh("ip", "netns", "exec", net.srv, "nft", "add", "table", "ip", rec.table)
    assert Proxy.observe(rec)
    Proxy.revert(rec)
    assert not Proxy.observe(rec) and net.ruleset(net.srv) == []


@requires_triton
def test_llm_proxy_on_replica_0_of_a_netns_reference_stalls_only_its_requests(tmp_path):
    """The reference gateway round-robins over two --netns Triton replicas and keeps its connections to them
    open: with existing: reset those to replica 0 are reset at apply, the gateway reconnects through the proxy;
    a client that talks only to the gateway sees the stall on every request replica 0 serves, none on
    replica 1's. After revert: no rule, no proxy, and requests flow (once the gateway has dropped the
    connections the proxy carried, each failing the request it was reused for)."""
    d = Deployment(tmp_path / "ref")
    facts = d.up(RefOptions(port=18840, replicas=2, netns=True), say=lambda _m: None)
    try:
        ns = facts["netns"]
        before = sh("ip", "netns", "exec", ns, "nft", "list", "ruleset")
        inj = LlmProxy(LlmProxy.Spec(type="llm.proxy", faults=[{"type": "stall", "after_tokens": 2,
                                                                   "duration": "300ms"}],
                                     intercept={"port": facts["replica_port"], "target": {"netns": ns},
                                                "existing": "reset"}))
        inj.preflight()
        rec = inj.apply(inj.prepare())
        try:
            assert rec.reset_connections >= 1  # the gateway's pooled connection(s) to replica 0
            got = [_stream(facts["gateway_port"]) for _ in range(6)]
        finally:
            LlmProxy.revert(rec)
        stalled = [g for g in got if g[1] == "stall-0"]
        assert len(stalled) == 3 and all(g[2] >= 0.3 for g in stalled), got  # replica 0's, round robin
        assert all(g[1] is None and g[2] < 0.25 for g in got if g not in stalled), got
        assert all(g[0] == 200 and g[3] == 6 for g in got), got  # every token arrived
        assert not LlmProxy.observe(rec) and sh("ip", "netns", "exec", ns, "nft", "list", "ruleset") == before
        after = [_stream(facts["gateway_port"])[:2] for _ in range(8)]
        # the gateway's pool reuses a connection the proxy carried without noticing it closed: one 502 on each
        # (it had at most 2 to replica 0), then it connects afresh, straight to the replica
        assert after.count((502, None)) <= 2 and after[-4:] == [(200, None)] * 4, after
        assert set(after) <= {(200, None), (502, None)}, after
    finally:
        d.down(say=lambda _m: None)


def _stream(port: int) -> tuple[int, str | None, float, int]:
    """One streamed generate through the gateway: status, X-Chaoskit-Fault, seconds, token events."""
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        t0 = time.monotonic()
        c.request("POST", "/v2/models/tiny_lm_stream/generate_stream",
                  json.dumps({"text_input": "chaos", "max_tokens": 6}), {"Content-Type": "application/json"})
        r = c.getresponse()
        body = r.read()
        return r.status, r.getheader("X-Chaoskit-Fault"), time.monotonic() - t0, body.count(b"data:")
    finally:
        c.close()
