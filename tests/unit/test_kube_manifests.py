"""deploy/k8s/chaoskit: every manifest validates against the OpenAPI models shipped with the kubernetes client
(unknown fields and missing required ones fail), the helper pod template is what the code builds, and the
Roles grant exactly the verbs the code sends (measured from its requests to FakeKubeApi)."""

from __future__ import annotations

import asyncio
import copy
import json
import re
from pathlib import Path

import pytest
import yaml
from kubernetes import client
from pydantic import ValidationError

from chaoskit.executors.k8s_helper import HelperPlacement, K8sHelperExecutor, helper_pod, replay_cluster
from chaoskit.injectors.kube import DeploymentScale, PodKill
from chaoskit.injectors.process import ProcessSignal
from chaoskit.probes.kube import KubePodsProbe
from chaoskit.targets.kube import ClusterRef
from tests.helpers.fake_kube import FakeKubeApi

DIR = Path(__file__).resolve().parents[2] / "deploy" / "k8s" / "chaoskit"
MODELS = {"Namespace": client.V1Namespace, "ServiceAccount": client.V1ServiceAccount, "Role": client.V1Role,
          "RoleBinding": client.V1RoleBinding, "Pod": client.V1Pod}


def docs(name: str) -> list[dict]:
    return [d for d in yaml.safe_load_all((DIR / name).read_text()) if d]


def validate(doc: dict) -> object:
    """The client's pydantic model of the document's kind; ValidationError on unknown or missing fields."""
    return MODELS[doc["kind"]].model_validate(doc)


def test_the_directory_holds_what_the_docs_name():
    assert sorted(p.name for p in DIR.iterdir()) == ["Dockerfile", "helper-pod.yaml", "namespace.yaml", "role.yaml",
                                                     "rolebinding.yaml", "serviceaccount.yaml"]


@pytest.mark.parametrize("name", sorted(p.name for p in DIR.glob("*.yaml")))
def test_each_manifest_validates_against_the_client_models(name):
    for doc in docs(name):
        assert doc["kind"] in MODELS, f"{name}: no model for kind {doc['kind']}"
        validate(doc)


def test_the_validation_can_fail():
    pod = docs("helper-pod.yaml")[0]
    typo = copy.deepcopy(pod)
    typo["spec"]["containers"][0]["securityContext"]["privileg"] = True
    missing = copy.deepcopy(pod)
    del missing["spec"]["containers"][0]["name"]
    for bad in (typo, missing):
        with pytest.raises(ValidationError):
            validate(bad)
    role = copy.deepcopy(docs("role.yaml")[0])
    role["rules"][0]["verb"] = role["rules"][0].pop("verbs")
    with pytest.raises(ValidationError):
        validate(role)


def test_bindings_point_at_the_roles_and_service_accounts():
    roles = {(d["metadata"]["namespace"], d["metadata"]["name"]) for d in docs("role.yaml")}
    accounts = {(d["metadata"]["namespace"], d["metadata"]["name"]) for d in docs("serviceaccount.yaml")}
    for b in docs("rolebinding.yaml"):
        assert (b["metadata"]["namespace"], b["roleRef"]["name"]) in roles
        assert {(s["namespace"], s["name"]) for s in b["subjects"]} <= accounts
    helper_sa = next(d for d in docs("serviceaccount.yaml") if d["metadata"]["name"] == "chaoskit-helper")
    assert helper_sa["automountServiceAccountToken"] is False


def test_the_helper_pod_template_is_what_the_code_builds():
    template = docs("helper-pod.yaml")[0]
    hp = HelperPlacement(cluster={}, node="NODE", run_id="RUN-ID", key="KEY")
    built = client.ApiClient().sanitize_for_serialization(
        helper_pod("revert", "network.netem", {"type": "network.netem", "record": {}}, hp))
    assert re.fullmatch(r"chaoskit-revert-key-[0-9a-f]{6}", built["metadata"]["name"])
    built["metadata"]["name"] = template["metadata"]["name"]
    built["metadata"]["labels"]["chaoskit.io/run"] = "RUN-ID"
    assert built == template


def _request_verbs(api: FakeKubeApi) -> dict[str, set[tuple[str, str, str]]]:
    """namespace kind (target / helpers) -> {(apiGroup, resource, verb)} of every request the code sent."""
    out: dict[str, set[tuple[str, str, str]]] = {"target": set(), "helpers": set()}
    for r in api.requests:
        m = re.fullmatch(r"/(?:api/v1|apis/(?P<g>[^/]+)/v1)/namespaces/(?P<ns>[^/]+)/(?P<res>[^/]+)"
                         r"(?:/(?P<name>[^/]+)(?:/(?P<sub>[^/]+))?)?", r.path)
        assert m, r.path
        resource = m["res"] + (f"/{m['sub']}" if m["sub"] else "")
        verb = {"GET": "get" if m["name"] else "list", "POST": "create", "PATCH": "patch", "DELETE": "delete"}
        out["helpers" if m["ns"] == "chaoskit" else "target"].add((m["g"] or "", resource, verb[r.method]))
    return out


def _role_verbs(name: str) -> set[tuple[str, str, str]]:
    role = next(d for d in docs("role.yaml") if d["metadata"]["name"] == name)
    return {(g, res, v) for rule in role["rules"] for g in rule["apiGroups"] for res in rule["resources"]
            for v in rule["verbs"]}


def _fake_agent(pod: dict) -> tuple[str, str]:
    verb = pod["metadata"]["labels"]["chaoskit.io/verb"]
    answer = {"apply": {"record": {"signal": "SIGSTOP", "targets": []}}, "revert": {"reverted": True},
              "observe": {"in_effect": False, "details": {}}}[verb]
    return "Succeeded", json.dumps(answer)


def test_the_roles_grant_exactly_the_verbs_the_code_sends(tmp_path, monkeypatch: pytest.MonkeyPatch):
    with FakeKubeApi() as api:
        api.kubelet = _fake_agent
        for i in range(2):
            api.add_pod("prod", f"web-{i}", {"app": "web"})
        api.add_deployment("prod", "web", 2)
        kc = api.write_kubeconfig(tmp_path / "kc")
        monkeypatch.setenv("KUBECONFIG", str(kc))
        target = {"kubernetes": {"namespace": "prod", "selector": {"app": "web"}}}
        kill = PodKill(PodKill.Spec.model_validate({"type": "pod.kill", "target": target}))
        kill.preflight()
        kill.apply(kill.prepare())
        scale = DeploymentScale(DeploymentScale.Spec.model_validate(
            {"type": "deployment.scale", "replicas": 0,
             "target": {"kubernetes": {"namespace": "prod", "deployment": "web"}}}))
        rec = scale.prepare()
        scale.apply(rec)
        DeploymentScale.observe(rec)
        DeploymentScale.revert(rec)
        probe = KubePodsProbe(KubePodsProbe.Spec.model_validate({"type": "kube.pods", "name": "p", "target": target}))
        asyncio.run(probe.measure())
        cluster = ClusterRef(str(kc), None)
        hp = HelperPlacement(cluster=cluster.to_json(), node="node-a", run_id="r1")
        sig = ProcessSignal(ProcessSignal.Spec.model_validate({"type": "process.signal", "pid": 1, "allow_host": True}))
        executor = K8sHelperExecutor()
        final = executor.apply(sig, {"signal": "SIGSTOP", "targets": []}, hp.to_json())
        executor.observe("process.signal", final, hp.to_json())
        assert [(r.key, r.error) for r in replay_cluster(cluster)] == [(hp.key, None)]  # list + revert + remove
        used = _request_verbs(api)
    assert used["target"] == _role_verbs("chaoskit-target")
    assert used["helpers"] == _role_verbs("chaoskit-helpers")  # secrets: create the key on first use, then get


def test_the_record_key_is_the_only_secret_chaoskit_may_read():
    role = next(d for d in docs("role.yaml") if d["metadata"]["name"] == "chaoskit-helpers")
    secrets = [r for r in role["rules"] if "secrets" in r["resources"]]
    assert [(r["verbs"], r.get("resourceNames")) for r in secrets] == [(["get"], ["chaoskit-record-key"]),
                                                                       (["create"], None)]
    assert all(r["resources"] == ["secrets"] for r in secrets)
