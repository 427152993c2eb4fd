"""HAProxy (Debian package) as an LLM gateway: round robin, active health checks of GET /health, layer-7 retries
on another replica (retry-on, redispatch), long server timeouts for streamed answers."""

from __future__ import annotations

import re
import shutil
from collections.abc import Callable
from pathlib import Path

from chaoskit.reference.gateways.base import GatewayKind, Launch, Upstream
from chaoskit.reference.gateways.install import apt_install, version_of


def binary() -> str:
    return shutil.which("haproxy") or "/usr/sbin/haproxy"


class HAProxy(GatewayKind):
    name = "haproxy"
    package = "haproxy"

    def installed(self) -> bool:
        return Path(binary()).exists()

    def install(self, say: Callable[[str], None], force: bool = False) -> tuple[str, bool]:
        return apt_install(self.package, "haproxy", say, force)

    def version(self) -> str:
        return version_of([binary(), "-v"], lambda out: (m.group(1) if (m := re.search(r"version (\S+)", out))
                                                        else ""))

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
        return Launch([binary(), "-db", "-f", str(conf)], settings, conf)
