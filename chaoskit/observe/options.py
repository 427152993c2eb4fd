"""What a run exports to (its --metrics-port, --pushgateway, --otlp-endpoint): plain data, quick to import."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ObserveOptions:
    """What `chaoskit run` was told to export to."""

    metrics_port: int | None = None  # serve /metrics here for the life of the run
    metrics_addr: str = "127.0.0.1"
    pushgateway: str | None = None  # push the final state here
    otlp_endpoint: str | None = None  # OTLP/HTTP traces (base URL, e.g. http://127.0.0.1:4318)
    timeout_s: float = 3.0  # each push or export gives up after this

    @property
    def wanted(self) -> bool:
        return self.metrics_port is not None or bool(self.pushgateway) or bool(self.otlp_endpoint)
