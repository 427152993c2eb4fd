"""What `chaoskit init` writes validates for every kind of server and fault, with hostile names quoted safely."""

from __future__ import annotations

import pytest

from chaoskit.experiment.loader import load_experiment
from chaoskit.init_detect import Detected, openai_models, triton_models
from chaoskit.init_template import Plan, render

ODD_MODEL = 'acme/llama: "v2" #1 {x} \\ ünï'
KINDS = [Detected("openai", ODD_MODEL, "/v1/models", evidence="e"),
         Detected("triton", ODD_MODEL, f"/v2/models/{ODD_MODEL}/ready", evidence="e"),
         Detected("triton", None, "/v2/health/ready", evidence="e", notes=["no model"]),
         Detected("http", None, "/healthz", evidence="e"),
         Detected("http", None, "/", 0, evidence="e", notes=["no health"]),
         Detected(None, notes=["connection refused"])]
FAULTS = [{"proxy_port": 18100}, {"pid": 4242}, {"process_name": 'vllm{x}|python\\d{1,2}: "x"'}]


@pytest.mark.parametrize("fault", FAULTS, ids=["proxy", "pid", "process-name"])
@pytest.mark.parametrize("found", KINDS, ids=["openai", "triton", "triton-no-model", "http", "http-no-health",
                                               "none"])
def test_every_variant_validates_and_keeps_values(tmp_path, found, fault):
    path = tmp_path / "x.yaml"
    path.write_text(render(Plan("http://127.0.0.1:8000", "my-first.exp", found, **fault)))
    exp = load_experiment(path, strict=False).experiment
    assert exp.metadata.name == "my-first.exp" and len(exp.safeguards) == 1
    loads = [p.load for p in exp.steady_state.probes if p.type == "slo"]
    if found.kind != "http":
        assert {lo.model for lo in loads} == {found.model or "MODEL"}
    inject = exp.method[0].inject
    if "proxy_port" in fault:
        assert inject.type == "llm.proxy" and inject.listen == "127.0.0.1:18100" and inject.faults[0].share == 0.05
        assert loads[-1].url.startswith("http://127.0.0.1:18100")
    else:
        assert inject.type == "process.signal" and (inject.pid, inject.name) == (fault.get("pid"),
                                                                                  fault.get("process_name"))


def test_model_lists():
    assert openai_models({"data": [{"id": "a"}, {"id": ""}, {"x": 1}, {"id": "b"}]}) == ["a", "b"]
    assert openai_models({"data": None}) == [] and openai_models([]) == []
    rows = [{"name": "old", "state": "UNAVAILABLE"}, {"name": "tiny_lm", "state": "READY"}, {"name": "bare"}]
    assert triton_models(rows) == ["tiny_lm", "bare", "old"] and triton_models({"error": "x"}) == []
