"""LiteLLM's proxy (PyPI `litellm[proxy]`, in a venv of its own) as an LLM gateway: one deployment per replica
under one model name, its router's retries, allowed failures and cooldown (its ejection) on."""

from __future__ import annotations

import json
from pathlib import Path

from chaoskit.reference.gateways.base import Launch, PipGateway, Upstream

NUMBERS = ("num_retries", "allowed_fails", "cooldown_time", "timeout", "stream_timeout")


def number(text: str) -> int | float:
    return int(text) if text.isdigit() else float(text)


class LiteLLM(PipGateway):
    name = "litellm"
    package = "litellm[proxy]==1.108.7"

    def launch(self, root: Path, upstreams: list[Upstream], port: int, aux_port: int,
               settings: dict[str, str], model: str) -> Launch:
        router = {k: (number(v) if k in NUMBERS else v) for k, v in settings.items()}
        config = {"model_list": [{"model_name": model, "litellm_params": {
                      "model": f"openai/{model}", "api_base": f"{u.url}/v1", "api_key": "none"}} for u in upstreams],
                  "router_settings": router}
        conf = root / "litellm.json"  # YAML is a superset of JSON: litellm --config reads it
        conf.write_text(json.dumps(config, indent=2))
        env = {"LITELLM_DANGEROUSLY_PERMIT_WEAK_OR_UNSET_MASTER_KEY": "true",  # no key: it binds 127.0.0.1 only
               "LITELLM_LOCAL_MODEL_COST_MAP": "True", "LITELLM_TELEMETRY": "False", "NO_COLOR": "1"}
        return Launch([self.program("litellm"), "--config", str(conf), "--host", "127.0.0.1",
                       "--port", str(port), "--num_workers", "1"], settings, conf, env)
