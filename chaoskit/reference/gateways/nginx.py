"""nginx (Debian package) as an LLM gateway: round robin over the replicas, passive health checks (max_fails,
fail_timeout: nginx open source has no active ones), retries of failed attempts on the next replica, no buffering
of streamed answers."""

from __future__ import annotations

import re
import shutil
from collections.abc import Callable
from pathlib import Path

from chaoskit.reference.gateways.base import GatewayKind, Launch, Upstream
from chaoskit.reference.gateways.install import apt_install, version_of


def binary() -> str:
    return shutil.which("nginx") or "/usr/sbin/nginx"


class Nginx(GatewayKind):
    name = "nginx"
    package = "nginx"

    def installed(self) -> bool:
        return Path(binary()).exists()

    def install(self, say: Callable[[str], None], force: bool = False) -> tuple[str, bool]:
        return apt_install(self.package, "nginx", say, force)

    def version(self) -> str:
        return version_of([binary(), "-v"], lambda out: (m.group(1) if (m := re.search(r"nginx/(\S+)", out))
                                                        else ""))

    def launch(self, root: Path, upstreams: list[Upstream], port: int, aux_port: int,
               settings: dict[str, str]) -> Launch:
        (root / "nginx").mkdir(parents=True, exist_ok=True)
        servers = "\n".join(f"    server {u.host}:{u.port} max_fails={settings['max_fails']} "
                            f"fail_timeout={settings['fail_timeout']};" for u in upstreams)
        conf = root / "nginx" / "nginx.conf"
        conf.write_text(f"""# written by chaoskit for the reference deployment
worker_processes 1;
pid {root}/nginx/nginx.pid;
error_log stderr warn;
events {{ worker_connections 4096; }}
http {{
  access_log off;
  client_body_temp_path {root}/nginx/body;
  proxy_temp_path {root}/nginx/proxy;
  upstream replicas {{
{servers}
    keepalive 32;
  }}
  server {{
    listen 127.0.0.1:{port};
    client_max_body_size 8m;
    location / {{
      proxy_pass http://replicas;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
      proxy_buffering off;
      proxy_next_upstream {settings['proxy_next_upstream']};
      proxy_next_upstream_tries {settings['proxy_next_upstream_tries']};
      proxy_connect_timeout {settings['proxy_connect_timeout']};
      proxy_read_timeout {settings['proxy_read_timeout']};
    }}
  }}
}}
""")
        return Launch([binary(), "-p", str(root / "nginx"), "-c", str(conf), "-g", "daemon off;"], settings, conf)
