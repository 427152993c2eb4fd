"""Transparent interception (network.proxy / llm.proxy `intercept`) and queue-mode network.netem on a Kubernetes
pod, through the helper pod of its node: FakeKubeApi's fake kubelet runs the real `python -m chaoskit.agent` on
this host, which finds the pod's container (a stand-in: real processes in a real network namespace, found by their
CRI ID) and runs the proxy, or the netemq helper, in that namespace with the nft redirect or NFQUEUE rule there.
Clients in the other namespace of a veth pair reach the pod's IP:port as they would from another node."""

from __future__ import annotations

import os
import socket
import statistics
import struct
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from threading import Thread

import pytest

from chaoskit.executors.k8s_helper import K8sHelperExecutor, replay_cluster, wire_spec
from chaoskit.executors.layer import place
from chaoskit.injectors.base import K8S_HELPER, FaultContext
from chaoskit.injectors.llm_proxy.fault import LlmProxy
from chaoskit.injectors.netem.fault import Netem
from chaoskit.injectors.proxy.fault import Proxy
from chaoskit.targets.kube import resolve_cluster
from chaoskit.targets.netns import run_in_netns
from chaoskit.targets.process import all_pids, cmdline
from tests.conftest import wait_for
from tests.helpers import standin_container
from tests.helpers.fake_kube import FakeKubeApi, run_pod_here
from tests.helpers.netpair import CLIENT_IP, SERVER_IP, Pair, queue_mode_missing

PORT = 8000
GET = b"GET / HTTP/1.1\r\nHost: web\r\nConnection: close\r\n\r\n"
ROOT = pytest.mark.skipif(os.geteuid() != 0, reason="network namespaces, nftables and cgroups need root")
pytestmark = pytest.mark.usefixtures("no_kube_env")


class _Web(BaseHTTPRequestHandler):
    """The pod's server: each request answered with the peer address it saw, head and body in one write (one
    chunk for the proxy's toxics), then the connection closed (HTTP/1.0)."""

    protocol_version = "HTTP/1.0"

    def do_GET(self) -> None:  # noqa: N802
        body = self.client_address[0].encode()
        self.wfile.write(b"HTTP/1.0 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))

    def do_POST(self) -> None:  # noqa: N802
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.do_GET()

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def pod() -> Iterator[tuple[Pair, standin_container.StandIn]]:
    """A stand-in container in the server namespace of a veth pair, serving HTTP on SERVER_IP:PORT there."""
    root = standin_container.hierarchy_or_skip()
    pair = Pair()
    srv = ThreadingHTTPServer(("0.0.0.0", PORT), _Web, bind_and_activate=False)
    srv.socket.close()
    srv.socket = run_in_netns(pair.path(pair.srv), lambda: socket.create_server(("0.0.0.0", PORT), backlog=128))
    srv.daemon_threads = True
    Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    container = None
    try:
        container = standin_container.start(pair.srv, root)
        wait_for(lambda: len(container.pids()) == 2, timeout=10)
        yield pair, container
    finally:
        if container is not None:
            container.stop()
        srv.shutdown()
        srv.server_close()
        pair.close()


@pytest.fixture
def kube(pod, tmp_path) -> Iterator[tuple[FakeKubeApi, str]]:
    """FakeKubeApi with pod web-0 (app=web, node-a) whose container is the stand-in; helper pods run here."""
    _, container = pod
    with FakeKubeApi() as api:
        api.kubelet = run_pod_here
        api.add_pod("prod", "web-0", {"app": "web"}, node="node-a", container_ids=(container.container_id,))
        yield api, str(api.write_kubeconfig(tmp_path / "kubeconfig"))


def request(pair: Pair, head: bytes = GET) -> tuple[bytes, float]:
    """One request on a new connection from the client namespace to the pod's IP:port: (the answer, seconds from
    connect to the server's close)."""

    def go() -> tuple[bytes, float]:
        t0 = time.monotonic()
        with socket.create_connection((SERVER_IP, PORT), timeout=10) as s:
            s.sendall(head)
            data = b""
            while chunk := s.recv(4096):
                data += chunk
        return data, time.monotonic() - t0

    return run_in_netns(pair.path(pair.cli), go)


def peers_and_ms(pair: Pair, n: int) -> tuple[set[str], float]:
    """The peer addresses the server saw and the median request time (ms) over n requests."""
    got = [request(pair) for _ in range(n)]
    return {a.rpartition(b"\r\n\r\n")[2].decode() for a, _ in got}, statistics.median(t for _, t in got) * 1e3


def chaoskit_tables(pair: Pair) -> list[str]:
    return sorted(x["table"]["name"] for x in pair.ruleset(pair.srv)
                  if "table" in x and x["table"]["name"].startswith("chaoskit"))


def marked(token: str) -> list[int]:
    return [p for p in all_pids() if token in cmdline(p)]


def kube_target(kubeconfig: str) -> dict:
    return {"kubernetes": {"namespace": "prod", "selector": {"app": "web"}, "mode": "one", "kubeconfig": kubeconfig}}


def cluster_is_clean(api: FakeKubeApi) -> bool:
    """No helper pod left (the holder deleted too) and no revert record."""
    return sorted(api.state.pods) == [("prod", "web-0")] and api.state.configmaps == {}


@ROOT
def test_network_proxy_intercepts_a_pods_port_through_a_helper_pod_and_is_reverted_and_rolled_back(pod, kube):
    """Latency toxic 100 ms on the pod's port 8000: a request from the other namespace to the pod's IP takes
    ~100 ms more and reaches the server from the namespace's own address (the proxy's connection); after the
    revert (and after `rollback --cluster`'s replay of a second apply) the table and the proxy are gone."""
    pair, container = pod
    api, kubeconfig = kube
    spec = Proxy.Spec.model_validate({"type": "network.proxy", "toxics": [{"type": "latency", "latency": "100ms"}],
                                      "intercept": {"port": PORT, "target": kube_target(kubeconfig)}})
    executor = K8sHelperExecutor()
    base_peers, base_ms = peers_and_ms(pair, 5)
    assert base_peers == {CLIENT_IP}

    inj = Proxy(spec, FaultContext(lifetime_s=600.0, run_id="intercept-test"))
    place(inj)
    assert inj.ctx.executor == K8S_HELPER
    plan = executor.plan(inj)
    assert plan[0].startswith("on node node-a: a helper pod (chaoskit:latest, hostPID, capabilities NET_ADMIN, "
                              "SYS_ADMIN, SYS_PTRACE) intercepts port 8000 in the network namespace of pod "
                              "prod/web-0 container app: network.proxy, a proxy with toxics: latency"), plan
    record = executor.apply(inj, executor.prepare(inj), inj.ctx.placement)
    try:
        (one,) = record["pods"]
        local = one["record"]
        assert local["ns"] == f"/proc/{container.proc.pid}/ns/net" and chaoskit_tables(pair) == [local["table"]]
        assert len(marked(local["token"])) == 1
        peers, during_ms = peers_and_ms(pair, 5)
        assert executor.observe(inj.type, record, inj.ctx.placement) is True
    finally:
        executor.revert(inj.type, record, inj.ctx.placement)
    after_peers, after_ms = peers_and_ms(pair, 5)
    print(f"\nnetwork.proxy latency 100ms through the helper pod: median request {base_ms:.1f} ms before, "
          f"{during_ms:.1f} ms during, {after_ms:.1f} ms after the revert")
    assert peers == {SERVER_IP}  # through the proxy, which connects from inside the namespace
    assert 95 <= during_ms - base_ms <= 160
    assert chaoskit_tables(pair) == [] and marked(local["token"]) == []
    assert after_peers == {CLIENT_IP} and after_ms < base_ms + 30
    assert executor.observe(inj.type, record, inj.ctx.placement) is False
    assert cluster_is_clean(api)

    # the host is gone: `chaoskit rollback --cluster` from the cluster's signed record alone
    inj = Proxy(spec, FaultContext(lifetime_s=600.0, run_id="intercept-test"))
    place(inj)
    record = executor.apply(inj, executor.prepare(inj), inj.ctx.placement)
    token = record["pods"][0]["record"]["token"]
    assert chaoskit_tables(pair) and marked(token) and peers_and_ms(pair, 1)[0] == {SERVER_IP}
    replayed = replay_cluster(resolve_cluster(spec.intercept.target.kubernetes))
    assert [(r.key, r.error) for r in replayed] == [(f"{inj.ctx.placement.key}-node-a", None)]
    assert chaoskit_tables(pair) == [] and marked(token) == [] and peers_and_ms(pair, 1)[0] == {CLIENT_IP}
    assert cluster_is_clean(api)


@ROOT
def test_llm_proxy_intercepts_a_pods_port_through_a_helper_pod(pod, kube):
    """abort 503 on /v1/*: a completion to the pod's IP is answered 503 by the proxy in the pod's namespace, a GET
    is forwarded; after the revert both reach the server straight."""
    pair, _ = pod
    api, kubeconfig = kube
    spec = LlmProxy.Spec.model_validate({"type": "llm.proxy", "intercept": {"port": PORT, "target": kube_target(kubeconfig)},
                                         "faults": [{"type": "abort", "status": 503, "match": {"path": "/v1/*"}}]})
    completion = b"POST /v1/completions HTTP/1.1\r\nHost: web\r\nConnection: close\r\nContent-Length: 2\r\n\r\n{}"
    inj, executor = LlmProxy(spec, FaultContext(lifetime_s=600.0, run_id="llm-intercept")), K8sHelperExecutor()
    place(inj)
    record = executor.apply(inj, executor.prepare(inj), inj.ctx.placement)
    try:
        aborted, forwarded = request(pair, completion)[0], request(pair)[0]
        details = executor.observe_details(inj.type, record, inj.ctx.placement)
    finally:
        executor.revert(inj.type, record, inj.ctx.placement)
    assert aborted.startswith(b"HTTP/1.1 503") or aborted.startswith(b"HTTP/1.0 503"), aborted
    assert forwarded.endswith(SERVER_IP.encode())  # forwarded by the proxy, from inside the namespace
    pod_details = details["pods"]["node-a/web-0"]
    assert pod_details["in_effect"] is True and pod_details["faults"]["abort-0"]["applied"] == 1
    assert request(pair, completion)[0].startswith(b"HTTP/1.0 200") and request(pair)[0].endswith(CLIENT_IP.encode())
    assert chaoskit_tables(pair) == [] and marked(record["pods"][0]["record"]["token"]) == []
    assert cluster_is_clean(api)


def connect_rtts_ms(pair: Pair, n: int) -> list[float]:
    """TCP connect round trips to the pod's IP:port, in ms, as the kernel measures them (tcpi_rtt after the
    handshake: SYN sent to SYN-ACK received), which a busy host's thread wake-ups do not inflate."""

    def go() -> list[float]:
        out = []
        for _ in range(n):
            with socket.create_connection((SERVER_IP, PORT), timeout=10) as s:
                info = s.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 104)
                out.append(struct.unpack_from("=I", info, 68)[0] / 1e3)  # tcpi_rtt, us
        return out

    return run_in_netns(pair.path(pair.cli), go)


@pytest.mark.skipif(queue_mode_missing() is not None, reason=f"queue mode cannot run here: {queue_mode_missing()}")
def test_queue_mode_netem_delays_a_pods_egress_through_a_helper_pod(pod, kube):
    """network.netem mode: queue, 30 ms on the pod's egress: the netemq helper and the NFQUEUE rule go into the
    pod's namespace from the node's helper pod; each SYN-ACK it sends waits 30 ms, so the client's connect RTT
    grows by 30 ms; after the revert the table and the helper are gone and the RTT is back."""
    pair, _ = pod
    api, kubeconfig = kube
    spec = Netem.Spec.model_validate({"type": "network.netem", "mode": "queue", "delay": "30ms",
                                      "target": kube_target(kubeconfig)})
    base = statistics.median(connect_rtts_ms(pair, 20))
    inj, executor = Netem(spec, FaultContext(lifetime_s=600.0, run_id="netemq-test")), K8sHelperExecutor()
    place(inj)
    plan = executor.plan(inj)
    assert plan[0].startswith("on node node-a: a helper pod (chaoskit:latest, hostPID, capabilities NET_ADMIN, "
                              "NET_RAW, SYS_ADMIN, SYS_PTRACE) applies network.netem"), plan
    record = executor.apply(inj, executor.prepare(inj), inj.ctx.placement)
    try:
        local = record["pods"][0]["record"]
        assert local["mode"] == "queue" and local["ifname"] == "eth0"
        assert chaoskit_tables(pair) == [local["table"]] and len(marked(local["token"])) == 1
        during = statistics.median(connect_rtts_ms(pair, 20))
        details = executor.observe_details(inj.type, record, inj.ctx.placement)["pods"]["node-a/web-0"]
    finally:
        executor.revert(inj.type, record, inj.ctx.placement)
    after = statistics.median(connect_rtts_ms(pair, 20))
    print(f"\nnetwork.netem queue 30ms through the helper pod: median connect RTT {base:.3f} ms before, "
          f"{during:.3f} ms during, {after:.3f} ms after the revert")
    assert details["in_effect"] is True and details["mode"] == "queue" and details["helper"]["seen"] > 0
    assert abs(during - base - 30) <= 3
    assert after < base + 3
    assert chaoskit_tables(pair) == [] and marked(local["token"]) == []
    assert cluster_is_clean(api)


def test_intercept_takes_a_kubernetes_target_and_refuses_files_of_this_host_there():
    kube = {"kubernetes": {"namespace": "prod", "selector": {"app": "web"}}}
    spec = Proxy.Spec.model_validate({"type": "network.proxy", "intercept": {"port": PORT, "target": kube}})
    assert spec.listen == "[::]:0" and spec.intercept.target.kubernetes.helper.image == "chaoskit:latest"
    with pytest.raises(ValueError, match="listen_tls names files on this host"):
        LlmProxy.Spec.model_validate({"type": "llm.proxy", "intercept": {"port": PORT, "target": kube},
                                      "listen_tls": {"cert_file": "c.pem", "key_file": "k.pem"}})
    with pytest.raises(ValueError, match="intercept needs target.netns, target.pid or target.kubernetes"):
        Proxy.Spec.model_validate({"type": "network.proxy", "intercept": {"port": PORT, "target": {}}})


def test_the_spec_a_helper_validates_again_keeps_every_percentage():
    """A model dumps a percentage as a fraction (toxicity 100% as 1.0), which read back as a bare number would be
    1%: the request carries each as a number of percent, so the node's spec equals this host's."""
    kube = {"kubernetes": {"namespace": "prod", "selector": {"app": "web"}}}
    specs = [
        Proxy.Spec.model_validate({"type": "network.proxy", "intercept": {"port": PORT, "target": kube},
                                   "toxics": [{"type": "latency", "latency": "100ms"},
                                              {"type": "timeout", "toxicity": "5%"}]}),
        LlmProxy.Spec.model_validate({"type": "llm.proxy", "intercept": {"port": PORT, "target": kube},
                                      "faults": [{"type": "abort", "status": 503, "share": "20%"}]}),
        Netem.Spec.model_validate({"type": "network.netem", "delay": "10ms", "loss": "0.2%", "target": kube}),
    ]
    for spec in specs:
        assert type(spec).model_validate(wire_spec(spec)) == spec
    assert wire_spec(specs[0])["toxics"][0]["toxicity"] == "100%" and wire_spec(specs[2])["loss"] == "0.2%"
