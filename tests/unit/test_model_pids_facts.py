"""{target.replicas[N].model_pids}: a Triton replica's model processes, as a whole list (where a field takes PIDs)
or item by item; checked at validate against what the deployment will have (two per Triton replica, none for
vLLM)."""

from __future__ import annotations

from pathlib import Path

import pytest

from chaoskit.errors import SpecError
from chaoskit.experiment.loader import load_experiment
from chaoskit.targets.facts import addressable, reference_shape

FACTS = {"url": "http://127.0.0.1:8000", "replica_pid": 10, "replica_pids": [10, 20],
         "replicas": [{"name": "triton-0", "pid": 10, "model_pids": [11, 12]},
                      {"name": "triton-1", "pid": 20, "model_pids": [21, 22]}]}


def experiment(tmp_path: Path, pid: str, reference: str = "{engine: triton, replicas: 2}") -> Path:
    f = tmp_path / "stop-stubs.yaml"
    f.write_text(f"apiVersion: chaoskit/v1\nkind: Experiment\nmetadata: {{name: stop-stubs}}\n"
                 f"target: {{reference: {reference}}}\n"
                 "steadyState:\n  probes:\n    - {name: h, type: http, url: \"{target.url}/v2/health/ready\"}\n"
                 f"method:\n  - inject: {{type: process.signal, pid: \"{pid}\"}}\n    duration: 1s\n")
    return f


def test_the_whole_list_and_each_item_resolve(tmp_path: Path) -> None:
    whole = load_experiment(experiment(tmp_path, "{target.replicas[1].model_pids}"), deployed=FACTS).experiment
    assert whole.method[0].inject.pid == [21, 22]
    one = load_experiment(experiment(tmp_path, "{target.replicas[0].model_pids[1]}"), deployed=FACTS).experiment
    assert one.method[0].inject.pid == 12


def test_the_shape_has_two_model_processes_per_triton_replica_and_none_for_vllm() -> None:
    names = set(addressable("target", reference_shape("triton", 2)))
    assert {"target.replicas[1].model_pids", "target.replicas[1].model_pids[1]"} <= names
    assert "target.replicas[1].model_pids[2]" not in names
    assert not any("model_pids" in n for n in addressable("target", reference_shape("vllm", 2)))


@pytest.mark.parametrize(("pid", "reference", "why"), [
    ("{target.replicas[0].model_pids[2]}", "{engine: triton, replicas: 2}",
     "index out of range, replicas[0].model_pids has 2 items (indices 0..1)"),
    ("{target.replicas[2].model_pids[0]}", "{engine: triton, replicas: 2}",
     "index out of range, the deployment has 2 replicas (indices 0..1)"),
    ("{target.replicas[0].model_pid}", "{engine: triton, replicas: 2}", "(did you mean"),
    ("{target.replicas[0].model_pids}", "{engine: vllm, replicas: 1}", "unknown substitution"),
])
def test_what_the_deployment_cannot_have_is_refused_at_validate(tmp_path: Path, pid: str, reference: str,
                                                               why: str) -> None:
    with pytest.raises(SpecError) as e:
        load_experiment(experiment(tmp_path, pid, reference), strict=False)
    assert f"unknown substitution {pid}" in str(e.value) and why in str(e.value), str(e.value)
