"""What `chaoskit ref up` is asked for: engine, replicas, ports, gateway and their settings (RefOptions)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

GATEWAY_PARAMS = {"gateway_retry": "retry", "gateway_retry_on_death": "retry_on_death",  # model_params the gateway
                  "gateway_pd_abort": "pd_abort"}
# takes (GatewayConfig's retry settings, "true"/"false"), not the model: a scenario's `when: {fix: ...}` sets them


@dataclass
class RefOptions:
    engine: str = "triton"
    replicas: int = 2
    port: int = 8000
    netns: bool = False
    health: str = "status"
    latency_threshold_ms: float = 500.0
    model_params: dict[str, str] = field(default_factory=dict)
    disaggregated: tuple[int, int] | None = None  # (prefill, decode) servers of tiny_lm split (pd_server)
    gateway: str = "chaoskit"  # or a third-party one (chaoskit.reference.gateways)
    gateway_params: dict[str, str] = field(default_factory=dict)  # a third-party gateway's settings
    tap: bool = True  # a third-party gateway reaches each replica through a counting pass-through (reference.tap)
    mcp: bool = False  # also a small MCP tool server (reference.tiny_mcp) on the port after the others

    @property
    def third_party(self) -> bool:
        return self.gateway != "chaoskit"

    def settings(self) -> dict[str, Any]:
        """What makes two deployments' replicas the same, whatever their ports (an experiment reuses a running
        one, switching the gateway's health settings where they differ)."""
        return {"engine": self.engine, "replicas": self.replicas, "netns": self.netns,
                "model_params": dict(sorted(self.model_params.items())),
                **({"disaggregated": list(self.disaggregated)} if self.disaggregated else {}),
                **({"gateway": self.gateway, "gateway_params": dict(sorted(self.gateway_params.items())),
                    "tap": self.tap} if self.third_party else {}),
                **({"mcp": True} if self.mcp else {})}

    def model_settings(self) -> dict[str, str]:
        """The tiny_lm parameters: model_params less the gateway's (GATEWAY_PARAMS)."""
        return {k: v for k, v in self.model_params.items() if k not in GATEWAY_PARAMS}

    def gateway_settings(self) -> dict[str, bool]:
        """The gateway's retry settings named in model_params (GATEWAY_PARAMS), as GatewayConfig fields."""
        return {name: self.model_params[k].strip().lower() == "true" for k, name in GATEWAY_PARAMS.items()
                if k in self.model_params}

    def health_settings(self) -> dict[str, Any]:
        """The gateway's health settings (POST /gateway/config takes the same)."""
        return {"health_mode": self.health, "latency_threshold_ms": round(self.latency_threshold_ms, 3)}
