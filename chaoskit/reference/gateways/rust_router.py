"""vLLM Router and SGLang Model Gateway (PyPI wheels around the same Rust router): round robin over the replicas,
with their own retries, circuit breaker and health checks at the settings they ship with."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from chaoskit.reference.gateways.base import GatewayKind, Launch, Upstream
from chaoskit.reference.gateways.install import pip_install, pip_installed, venv_bin


class RustRouter(GatewayKind):
    pin: str
    program: str
    launch_args: tuple[str, ...] = ()

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

