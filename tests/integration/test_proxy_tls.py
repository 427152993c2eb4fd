"""network.proxy and llm.proxy with TLS: an HTTPS upstream signed by a CA this test makes (openssl), TLS ended
toward a client trusting that CA, and a wrong CA refused with a clear error (preflight, 502, journal)."""

from __future__ import annotations

import json
import shutil
import socket
import ssl
import subprocess
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from threading import Thread

import pytest

from chaoskit.errors import PreflightError
from chaoskit.injectors.llm_proxy.fault import LlmProxy
from chaoskit.injectors.proxy.fault import Proxy
from tests.conftest import chaoskit, write

pytestmark = pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl command")


def _ssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=30)


def _ca(d: Path, name: str) -> None:
    _ssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-keyout",
         f"{name}.key", "-out", f"{name}.pem", "-days", "2", "-subj", f"/CN={name}", cwd=d)


@pytest.fixture(scope="module")
def pki(tmp_path_factory) -> Path:
    """ca.pem (signs server.pem for 127.0.0.1 and localhost) and other-ca.pem (signs nothing we use)."""
    d = tmp_path_factory.mktemp("pki")
    _ca(d, "ca")
    _ca(d, "other-ca")
    _ssl("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-keyout", "server.key",
         "-out", "server.csr", "-subj", "/CN=localhost", cwd=d)
    (d / "san.ext").write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    _ssl("x509", "-req", "-in", "server.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial", "-out",
         "server.pem", "-days", "2", "-extfile", "san.ext", cwd=d)
    return d


class _Hello(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_GET(self) -> None:  # noqa: N802
        body = json.dumps({"path": self.path, "tls": True}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture(scope="module")
def https_upstream(pki):
    """An HTTPS server on loopback with the test CA's certificate: its port."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(pki / "server.pem", pki / "server.key")
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _Hello)
    srv.socket = ctx.wrap_socket(srv.socket, server_side=True)
    srv.daemon_threads = True
    Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    yield srv.server_address[1]
    srv.shutdown()
    srv.server_close()


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def started():
    """Apply proxies (cls, spec) on free ports; each reverted at the end."""
    recs: list[tuple[type, dict]] = []

    def start(cls: type, preflight: bool = True, **spec) -> tuple[int, object, dict]:
        port = _port()
        inj = cls(cls.Spec(listen=f"127.0.0.1:{port}", **spec))
        if preflight:
            inj.preflight()
        recs.append((cls, inj.apply(inj.prepare())))
        return port, inj, recs[-1][1]

    yield start
    for cls, rec in recs:
        cls.revert(rec)
        assert not cls.observe(rec)


def _get(url: str, ca: Path | None = None, headers: dict | None = None) -> tuple[int, dict]:
    ctx = ssl.create_default_context(cafile=str(ca)) if ca else None
    req = urllib.request.Request(url, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=10, context=ctx) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def test_network_proxy_ends_tls_from_clients_and_starts_it_to_an_https_upstream(pki, https_upstream, started):
    port, inj, rec = started(Proxy, type="network.proxy", upstream=f"https://127.0.0.1:{https_upstream}",
                        upstream_tls={"ca_file": str(pki / "ca.pem")},
                        listen_tls={"cert_file": str(pki / "server.pem"), "key_file": str(pki / "server.key")},
                        toxics=[{"type": "latency", "latency": "1ms"}])
    assert "decrypts and re-encrypts" in inj.plan()[0] and "verified against" in inj.plan()[0]
    assert _get(f"https://127.0.0.1:{port}/v1/x", ca=pki / "ca.pem") == (200, {"path": "/v1/x", "tls": True})
    with pytest.raises(urllib.error.URLError, match="CERTIFICATE_VERIFY_FAILED"):  # the client checks our cert
        _get(f"https://127.0.0.1:{port}/", ca=pki / "other-ca.pem")


def test_llm_proxy_https_both_sides_faults_on_the_decrypted_requests(pki, https_upstream, started):
    port, inj, rec = started(LlmProxy, type="llm.proxy", upstream=f"https://localhost:{https_upstream}",
                        upstream_tls={"ca_file": str(pki / "ca.pem")},
                        listen_tls={"cert_file": str(pki / "server.pem"), "key_file": str(pki / "server.key")},
                        faults=[{"type": "abort", "status": 503, "match": {"path": "/v1/*",
                                                                            "headers": {"x-break": "1"}}}])
    assert "as localhost" in inj.plan()[0]
    base = f"https://127.0.0.1:{port}"
    assert _get(f"{base}/v1/models", ca=pki / "ca.pem") == (200, {"path": "/v1/models", "tls": True})
    assert _get(f"{base}/v1/models", ca=pki / "ca.pem", headers={"x-break": "1"})[0] == 503
    details = LlmProxy.observe_details(rec)  # its stats over HTTPS
    assert details["in_effect"] and details["faults"]["abort-0"]["applied"] == 1


def test_a_wrong_ca_is_refused_at_preflight_and_by_the_running_proxy(pki, https_upstream, started):
    wrong = {"ca_file": str(pki / "other-ca.pem")}
    for cls, type_ in ((Proxy, "network.proxy"), (LlmProxy, "llm.proxy")):
        inj = cls(cls.Spec(type=type_, listen=f"127.0.0.1:{_port()}", upstream=f"https://127.0.0.1:{https_upstream}",
                           upstream_tls=wrong))
        with pytest.raises(PreflightError, match="certificate is not trusted: .*other-ca.pem; .*insecure: true"):
            inj.preflight()
    port, _, _ = started(LlmProxy, preflight=False, type="llm.proxy", upstream=f"https://127.0.0.1:{https_upstream}",
                      upstream_tls=wrong)  # the upstream's certificate changed after preflight
    status, body = _get(f"http://127.0.0.1:{port}/v1/models")
    assert status == 502 and "certificate is not trusted" in body["error"]
    assert "certificate is not trusted" in _get(f"http://127.0.0.1:{port}/chaoskit/stats")[1]["upstream_error"]


def test_insecure_skips_verification_and_says_so_in_the_plan(https_upstream, started):
    port, inj, rec = started(Proxy, type="network.proxy", upstream=f"https://127.0.0.1:{https_upstream}",
                        upstream_tls={"insecure": True})
    assert "WITHOUT VERIFYING" in inj.plan()[0]
    with socket.create_connection(("127.0.0.1", port), timeout=10) as c:
        c.sendall(b"GET /plain HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        got = b""
        while chunk := c.recv(4096):
            got += chunk
    assert got.startswith(b"HTTP/1.1 200") and got.endswith(b'{"path": "/plain", "tls": true}')


def test_upstream_tls_needs_an_https_upstream():
    with pytest.raises(ValueError, match="upstream_tls goes with an https:// upstream"):
        Proxy.Spec(type="network.proxy", listen=":1", upstream="127.0.0.1:2", upstream_tls={})


def test_a_run_with_a_wrong_ca_ends_at_preflight_journaled_without_a_traceback(pki, https_upstream, tmp_path):
    exp = write(tmp_path / "e.yaml", f"""\
apiVersion: chaoskit/v1
kind: Experiment
metadata: {{name: tls-wrong-ca}}
steadyState:
  probes: [{{name: t, type: command, argv: ["true"], phases: [before]}}]
method:
  - inject: {{type: llm.proxy, listen: "127.0.0.1:{_port()}", upstream: "https://127.0.0.1:{https_upstream}",
             upstream_tls: {{ca_file: "{pki / 'other-ca.pem'}"}}}}
""")
    p = chaoskit("run", str(exp), "--out", str(tmp_path / "out"), "--plain", state=tmp_path / "state")
    out, err = p.communicate(timeout=60)
    assert p.returncode == 4 and "Traceback" not in out + err  # 4: preflight refused it
    events = [json.loads(x) for x in (tmp_path / "out" / "journal.jsonl").read_text().splitlines()]
    failed = [e for e in events if "certificate is not trusted" in json.dumps(e)]
    assert failed, events
