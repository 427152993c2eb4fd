"""HAProxy (Debian package) as an LLM gateway: round robin, active health checks of GET /health, layer-7 retries
on another replica (retry-on, redispatch), long server timeouts for streamed answers."""

from __future__ import annotations

from pathlib import Path

from chaoskit.reference.gateways.base import AptGateway, Launch, Upstream


class HAProxy(AptGateway):
    name = "haproxy"
    package = "haproxy"
    version_pattern = r"version (\S+)"

    def launch(self, root: Path, upstreams: list[Upstream], port: int, aux_port: int,
               settings: dict[str, str]) -> Launch:
        servers = "\n".join(f"  server {u.name} {u.host}:{u.port} check" for u in upstreams)
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
  option httpchk GET /health
  http-check expect status 200
  default-server inter {settings['inter']} fall {settings['fall']} rise {settings['rise']}
{servers}
""")
        return Launch([self.binary(), "-db", "-f", str(conf)], settings, conf)
