"""vLLM Router and SGLang Model Gateway (PyPI wheels around the same Rust router): round robin over the replicas,
with their own retries, circuit breaker and health checks at the settings they ship with."""

from __future__ import annotations

from pathlib import Path

from chaoskit.reference.gateways.base import Launch, PipGateway, Upstream


class RustRouter(PipGateway):
    binary_name: str
    launch_args: tuple[str, ...] = ()

    def launch(self, root: Path, upstreams: list[Upstream], port: int, aux_port: int,
               settings: dict[str, str], model: str) -> Launch:
        argv = [self.program(self.binary_name), *self.launch_args, "--host", "127.0.0.1", "--port", str(port),
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
    package = "vllm-router==0.1.17"
    binary_name = "vllm-router"


class SglangRouter(RustRouter):
    name = "sglang-router"
    package = "sglang-router==0.3.2"
    binary_name = "smg"
    launch_args = ("launch",)

