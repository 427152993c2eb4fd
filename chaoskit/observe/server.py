"""The run's /metrics endpoint: prometheus-client's HTTP server on the run's own registry, stopped with the run."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, start_http_server

STOP_WAIT_S = 2.0


class MetricsServer:
    """Serves `registry` on addr:port from a daemon thread until stop() (OSError if the port cannot be bound)."""

    def __init__(self, registry: CollectorRegistry, addr: str, port: int):
        self._httpd, self._thread = start_http_server(port, addr=addr, registry=registry)
        self.addr, self.port = addr, int(self._httpd.server_address[1])

    @property
    def url(self) -> str:
        host = f"[{self.addr}]" if ":" in self.addr else self.addr
        return f"http://{host}:{self.port}/metrics"

    def stop(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(STOP_WAIT_S)
