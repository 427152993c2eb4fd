"""What each third-party gateway of the reference deployment accepts: its name, and the settings chaoskit starts
it with (each overridable by a gateway_params key of the same name) plus the other keys it takes; read by the
experiment's validation and by the gateway kinds (chaoskit.reference.gateways) alike."""

from __future__ import annotations

from dataclasses import dataclass, field

CHAOSKIT = "chaoskit"  # chaoskit's own gateway (chaoskit.reference.gateway): no gateway_params
RUST_ROUTER_FLAGS = frozenset({
    "retry_max_retries", "retry_initial_backoff_ms", "retry_max_backoff_ms", "disable_retries",
    "cb_failure_threshold", "cb_success_threshold", "cb_timeout_duration_secs", "cb_window_duration_secs",
    "disable_circuit_breaker", "health_failure_threshold", "health_success_threshold", "health_check_timeout_secs",
    "health_check_interval_secs", "health_check_endpoint", "request_timeout_secs", "max_concurrent_requests",
    "queue_size", "queue_timeout_secs"})  # each becomes --NAME VALUE (underscores as dashes); "true" a bare flag


@dataclass(frozen=True)
class GatewayParams:
    defaults: dict[str, str]
    extra: frozenset[str] = field(default_factory=frozenset)
    choices: dict[str, tuple[str, ...]] = field(default_factory=dict)  # the keys that take one of a few words

    def known(self) -> frozenset[str]:
        return frozenset(self.defaults) | self.extra

    def unknown(self, params: dict[str, object]) -> list[str]:
        return sorted(set(params) - self.known())

    def wrong_values(self, params: dict[str, object]) -> list[str]:
        """'KEY: VALUE is not one of ...' for each value outside its key's choices."""
        return [f"{k}: {params[k]!r} is not one of {', '.join(words)}" for k, words in sorted(self.choices.items())
                if k in params and str(params[k]) not in words]

    def problem(self, params: dict[str, object]) -> str | None:
        """What is wrong with `params` in words (after the gateway's name), None when nothing is."""
        if unknown := self.unknown(params):
            return f"takes no {', '.join(unknown)} (it takes: {', '.join(sorted(self.known()))})"
        return "; ".join(self.wrong_values(params)) or None


ROUTER = GatewayParams({"policy": "round_robin"}, RUST_ROUTER_FLAGS)  # cache_aware (default) pins a prompt
PARAMS: dict[str, GatewayParams] = {
    "vllm-router": ROUTER,
    "sglang-router": ROUTER,
    "litellm": GatewayParams({"routing_strategy": "simple-shuffle", "num_retries": "2", "allowed_fails": "1",
                              "cooldown_time": "10", "timeout": "60", "stream_timeout": "60"}),
    "nginx": GatewayParams({  # passive health (open source nginx has no active checks): 1 failure ejects for 10 s
        "max_fails": "1", "fail_timeout": "10s",
        "proxy_next_upstream": "error timeout http_502 http_503 non_idempotent",  # POST is retried too
        "proxy_next_upstream_tries": "2", "proxy_connect_timeout": "2s", "proxy_read_timeout": "60s"}),
    "haproxy": GatewayParams({  # active checks every second; 2 failures eject, 2 passes readmit
        "inter": "1s", "fall": "2", "rise": "2", "retries": "2",
        "retry_on": "conn-failure empty-response response-timeout 503", "timeout_connect": "2s",
        "timeout_server": "60s",
        # passive checks of real traffic (HAProxy's `observe`): off as in HAProxy; layer7 counts 5xx answers but
        # 501/505, and error_limit of them in a row makes on_error act (mark-down ejects until `rise` checks pass)
        "observe": "none", "error_limit": "10", "on_error": "fail-check",
        # the active check: health (GET /health) or completion (POST a 1-token completion: the path clients use)
        "check": "health"}, choices={"check": ("health", "completion"), "observe": ("none", "layer4", "layer7"),
                             "on_error": ("fastinter", "fail-check", "sudden-death", "mark-down")}),
}
NAMES = (CHAOSKIT, *PARAMS)
