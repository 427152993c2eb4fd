"""vLLM Router and SGLang Model Gateway (PyPI wheels around the same Rust router): round robin over the replicas,
with their own retries, circuit breaker and health checks at the settings they ship with."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from chaoskit.reference.gateways.base import GatewayKind, Launch, Upstream
from chaoskit.reference.gateways.install import pip_install, pip_installed, venv_bin

# what gateway_params may set: each becomes --NAME VALUE (underscores as dashes); "true" a bare flag
FLAGS = frozenset({"retry_max_retries", "retry_initial_backoff_ms", "retry_max_backoff_ms", "disable_retries",
                   "cb_failure_threshold", "cb_success_threshold", "cb_timeout_duration_secs",
                   "cb_window_duration_secs", "disable_circuit_breaker", "health_failure_threshold",
                   "health_success_threshold", "health_check_timeout_secs", "health_check_interval_secs",
                   "health_check_endpoint", "request_timeout_secs", "max_concurrent_requests", "queue_size",
                   "queue_timeout_secs"})


class RustRouter(GatewayKind):
    pin: str
    program: str
    launch_args: tuple[str, ...] = ()
    defaults = {"policy": "round_robin"}  # the default, cache_aware, sends one prompt to one replica
    extra_params = FLAGS
    needs_aux_port = True  # its Prometheus listener (a fixed default port otherwise: two would collide)

    def installed(self) -> bool:
        return pip_installed(self.name, self.pin)

    def install(self, say: Callable[[str], None], force: bool = False) -> tuple[str, bool]:
        return pip_install(self.name, self.pin, say, force)

    def version(self) -> str:
        return self.pin.partition("==")[2]

    def launch(self, root: Path, upstreams: list[Upstream], port: int, aux_port: int,
               settings: dict[str, str]) -> Launch:
        argv = [str(venv_bin(self.name, self.program)), *self.launch_args, "--host", "127.0.0.1", "--port", str(port),
                "--prometheus-host", "127.0.0.1", "--prometheus-port", str(aux_port),
                "--worker-urls", *(u.url for u in upstreams)]
        for key, value in sorted(settings.items()):
            flag = "--" + key.replace("_", "-")
            if value.lower() == "true":
                argv.append(flag)
            elif value.lower() != "false":
                argv += [flag, value]
        return Launch(argv, settings, env={"NO_COLOR": "1"})


class VllmRouter(RustRouter):
    name = "vllm-router"
    package = pin = "vllm-router==0.1.17"
    program = "vllm-router"


class SglangRouter(RustRouter):
    name = "sglang-router"
    package = pin = "sglang-router==0.3.2"
    program = "smg"
    launch_args = ("launch",)

