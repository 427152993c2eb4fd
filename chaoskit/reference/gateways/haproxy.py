"""HAProxy (Debian package) as an LLM gateway: round robin, active health checks of GET /health (and, when asked,
passive ones of real answers: observe), layer-7 retries on another replica (retry-on, redispatch), long server
timeouts for streamed answers."""

from __future__ import annotations

import json
from pathlib import Path

from chaoskit.reference.gateways.base import AptGateway, Launch, Upstream


class HAProxy(AptGateway):
    name = "haproxy"
    package = "haproxy"
    version_pattern = r"version (\S+)"

    def launch(self, root: Path, upstreams: list[Upstream], port: int, aux_port: int,
               settings: dict[str, str], model: str) -> Launch:
        servers = "\n".join(f"  server {u.name} {u.host}:{u.port} check" for u in upstreams)
        observe = ("" if settings["observe"] == "none" else
                   f" observe {settings['observe']} error-limit {settings['error_limit']} on-error {settings['on_error']}")
        conf = root / "haproxy.cfg"
        conf.write_text(f"""# written by chaoskit for the reference deployment
global
  maxconn 4096
defaults
  mode http
  option http-buffer-request
  timeout connect {settings['timeout_connect']}
  timeout client 60s
  timeout server {settings['timeout_server']}
  retries {settings['retries']}
  option redispatch
  retry-on {settings['retry_on']}
frontend gateway
  bind 127.0.0.1:{port}
  default_backend replicas
backend replicas
  balance roundrobin
{_check(settings['check'], model)}
  http-check expect status 200
  default-server inter {settings['inter']} fall {settings['fall']} rise {settings['rise']}{observe}
{servers}
""")
        return Launch([self.binary(), "-db", "-f", str(conf)], settings, conf)


def _check(kind: str, model: str) -> str:
    """The active health check: GET /health, or a real 1-token completion (what a replica that answers /health
    but fails every request cannot pass)."""
    if kind == "health":  # (the catalog's choices: health or completion)
        return "  option httpchk GET /health"
    body = json.dumps({"model": model, "prompt": "health", "max_tokens": 1}, separators=(",", ":"))
    return ("  option httpchk\n  http-check send meth POST uri /v1/completions ver HTTP/1.1 hdr Host localhost "
            f"hdr Content-Type application/json body '{body}'")
