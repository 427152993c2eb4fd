"""Each helper pod gets exactly what its fault type declares (Injector.node_helper) and nothing else: the pod
spec of every k8s-helper fault type, each verb, read back; the table in docs/security.md is this test's output."""

from __future__ import annotations

from pathlib import Path

import pytest
from kubernetes import client

from chaoskit.executors import K8S_HELPER
from chaoskit.executors.k8s_helper import GPU_ENV, REQUEST_ENV, HelperPlacement, helper_pod
from chaoskit.injectors import INJECTORS

DOC = Path(__file__).resolve().parents[2] / "docs" / "security.md"
BEGIN, END = "<!-- helper-grants: checked by tests/unit/test_helper_grants.py -->", "<!-- /helper-grants -->"
HELPER_TYPES = sorted(c.type for c in INJECTORS if K8S_HELPER in c.executors)
HP = HelperPlacement(cluster={}, node="node-a", run_id="r", key="k", runtime_class="nvidia")


def built(verb: str, type_name: str) -> dict:
    return client.ApiClient().sanitize_for_serialization(helper_pod(verb, type_name, {"type": type_name}, HP))


def granted(pod: dict) -> tuple[tuple[str, ...], tuple[str, ...], bool]:
    """(capabilities added, host paths mounted, the node's GPUs) as the pod spec says, after checking that
    nothing else is granted."""
    spec = pod["spec"]
    (c,) = spec["containers"]
    sc = c["securityContext"]
    assert {k: sc[k] for k in ("privileged", "allowPrivilegeEscalation", "readOnlyRootFilesystem")} == {
        "privileged": False, "allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True}
    assert sc["capabilities"]["drop"] == ["ALL"] and set(sc) <= {"privileged", "allowPrivilegeEscalation",
                                                                 "readOnlyRootFilesystem", "runAsUser", "capabilities"}
    assert not spec.get("hostNetwork") and not spec.get("hostIPC") and spec["hostPID"] is True
    assert spec["automountServiceAccountToken"] is False and "initContainers" not in spec
    host = [v["hostPath"]["path"] for v in spec["volumes"] if "hostPath" in v]
    assert [v for v in spec["volumes"] if "hostPath" not in v] == [{"name": "state", "emptyDir": {"sizeLimit": "64Mi"}}]
    assert [m["mountPath"] for m in c["volumeMounts"]] == ["/var/lib/chaoskit", *host]  # each where it is on the host
    env = {e["name"]: e["value"] for e in c["env"]}
    gpu = env.keys() - {REQUEST_ENV} == GPU_ENV.keys() and spec.get("runtimeClassName") == "nvidia"
    assert gpu or (env.keys() == {REQUEST_ENV} and "runtimeClassName" not in spec)
    return tuple(sc["capabilities"].get("add") or ()), tuple(host), gpu


def test_there_are_helper_fault_types():
    assert {"network.netem", "process.signal", "process.cpu_throttle", "gpu.memory_pressure"} <= set(HELPER_TYPES)


@pytest.mark.parametrize("type_name", HELPER_TYPES)
def test_each_helper_pod_gets_exactly_what_its_type_declares(type_name):
    cls = next(c for c in INJECTORS if c.type == type_name)
    declared = cls.node_helper
    for verb in ("apply", "observe", "revert"):
        assert granted(built(verb, type_name)) == (declared.capabilities, declared.host_paths, declared.gpu)


def table() -> str:
    rows = ["| fault type | capabilities added (all others dropped) | host paths mounted | the node's GPUs |",
            "|---|---|---|---|"]
    for type_name in HELPER_TYPES:
        caps, host, gpu = granted(built("apply", type_name))
        rows.append(f"| `{type_name}` | {', '.join(f'`{c}`' for c in caps) or 'none'} | "
                    f"{', '.join(f'`{p}`' for p in host) or 'none'} | {'every GPU (NVIDIA toolkit)' if gpu else 'no'} |")
    return "\n".join(rows)


def test_the_docs_table_is_what_the_pods_are_granted():
    text = DOC.read_text()
    assert BEGIN in text and END in text, f"{DOC}: no {BEGIN} ... {END} block"
    inside = text.split(BEGIN, 1)[1].split(END, 1)[0].strip()
    assert inside == table(), f"replace the block in {DOC} with:\n{table()}"
