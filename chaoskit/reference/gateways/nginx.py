"""nginx (Debian package) as an LLM gateway: round robin over the replicas, passive health checks (max_fails,
fail_timeout: nginx open source has no active ones), retries of failed attempts on the next replica, no buffering
of streamed answers."""

from __future__ import annotations

from pathlib import Path

from chaoskit.reference.gateways.base import AptGateway, Launch, Upstream


class Nginx(AptGateway):
    name = "nginx"
    package = "nginx"
    version_pattern = r"nginx/(\S+)"

    def launch(self, root: Path, upstreams: list[Upstream], port: int, aux_port: int,
               settings: dict[str, str], model: str) -> Launch:
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
        return Launch([self.binary(), "-p", str(root / "nginx"), "-c", str(conf), "-g", "daemon off;"], settings, conf)
