"""deploy/k8s/chaoskit: every manifest validates against the OpenAPI models shipped with the kubernetes client
(unknown fields and missing required ones fail), the helper pod template is what the code builds, and the
Roles grant exactly the verbs the code sends (measured from its requests to FakeKubeApi), and the scheduled
suite's CronJob runs one suite at a time as `chaoskit`, refuses while halted (exit 4) and keeps its results."""

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

from chaoskit.executors import k8s_cuda_wrap as cuda_wrap
from chaoskit.executors.k8s_helper import HelperPlacement, K8sHelperExecutor, helper_pod, replay_cluster
from chaoskit.injectors.kube.fault import DeploymentScale, PodKill
from chaoskit.injectors.process.fault import ProcessSignal
from chaoskit.probes.kube import KubePodsProbe
from chaoskit.targets.kube import ClusterRef, api_client
from tests.helpers.fake_kube import FakeKubeApi

DIR = Path(__file__).resolve().parents[2] / "deploy" / "k8s" / "chaoskit"
MODELS = {"Namespace": client.V1Namespace, "ServiceAccount": client.V1ServiceAccount, "Role": client.V1Role,
          "RoleBinding": client.V1RoleBinding, "Pod": client.V1Pod, "CronJob": client.V1CronJob,
          "PersistentVolumeClaim": client.V1PersistentVolumeClaim}


def docs(name: str) -> list[dict]:
    return [d for d in yaml.safe_load_all((DIR / name).read_text()) if d]


def validate(doc: dict) -> object:
    """The client's pydantic model of the document's kind; ValidationError on unknown or missing fields."""
    return MODELS[doc["kind"]].model_validate(doc)


def test_the_directory_holds_what_the_docs_name():
    assert sorted(p.name for p in DIR.iterdir()) == ["Dockerfile", "cronjob.yaml", "helper-pod.yaml", "namespace.yaml",
                                                     "role.yaml", "rolebinding.yaml", "serviceaccount.yaml"]


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
        # gpu.cuda_fault's prepare: restart: wrap a Deployment (a rollout), wait for it, restore it
        api.rollout_s = 0.0
        api.add_rollout_deployment("prod", "llm", {"containers": [{"name": "vllm", "resources": {
            "limits": {"nvidia.com/gpu": "1"}}}]})
        apps, core = client.AppsV1Api(api_client(cluster)), client.CoreV1Api(api_client(cluster))
        assert cuda_wrap.wrap(apps, core, "prod", "llm", "img", None, "chaoskit", owner="r1/k1") is not None
        cuda_wrap.wait_rollout(apps, "prod", "llm", 5.0, poll_s=0.05)
        assert cuda_wrap.restore(apps, core, "prod", "llm", "chaoskit", owner="r1/k1") is not None
        cuda_wrap.wait_rollout(apps, "prod", "llm", 5.0, poll_s=0.05)
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


def _cronjob() -> tuple[dict, dict]:
    pvc, cron = docs("cronjob.yaml")
    return pvc, cron


def test_the_cronjob_runs_one_suite_at_a_time_as_chaoskit_and_keeps_results_on_its_claim():
    pvc, cron = _cronjob()
    job = cron["spec"]["jobTemplate"]["spec"]
    pod = job["template"]["spec"]
    (c,) = pod["containers"]
    assert cron["spec"]["concurrencyPolicy"] == "Forbid" and pod["serviceAccountName"] == "chaoskit"
    assert (job["backoffLimit"], pod["restartPolicy"]) == (0, "Never")  # a failed run is a failed Job, not retried
    assert job["podFailurePolicy"]["rules"][0] == {"action": "FailJob", "onExitCodes": {
        "containerName": c["name"], "operator": "In", "values": [4]}}
    (claim,) = [v["persistentVolumeClaim"]["claimName"] for v in pod["volumes"] if "persistentVolumeClaim" in v]
    assert claim == pvc["metadata"]["name"] and pvc["metadata"]["namespace"] == cron["metadata"]["namespace"]
    env = {e["name"]: e["value"] for e in c["env"]}
    mounted = {m["mountPath"] for m in c["volumeMounts"] if m["name"] == "results"}
    assert mounted == {env["CHAOSKIT_RESULTS"]} and env["CHAOSKIT_STATE_DIR"].startswith(env["CHAOSKIT_RESULTS"])
    assert "--pushgateway" in c["command"][2] and env["CHAOSKIT_PUSHGATEWAY"] == ""


def _cron_env(c: dict, tmp_path: Path, results: Path, **kw: str) -> dict[str, str]:
    import os
    import sys

    return {**os.environ, "HOME": str(tmp_path), "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}",
            **{e["name"]: e["value"] for e in c["env"] if e["name"] != "HOME"}, "CHAOSKIT_RESULTS": str(results),
            "CHAOSKIT_STATE_DIR": str(results / "state"), **kw}


def test_the_cronjobs_command_refuses_to_start_while_halted(tmp_path):
    """The container's command as written, with the real chaoskit, against FakeKubeApi: the cluster's lever
    pulled -> exit 4 (a failed Job) naming who pulled it and why, nothing run."""
    import subprocess

    from chaoskit.executors.k8s_halt import HaltLever, pull_lever
    from chaoskit.targets.kube import api_client

    c = _cronjob()[1]["spec"]["jobTemplate"]["spec"]["template"]["spec"]["containers"][0]
    with FakeKubeApi() as api:
        kc = api.write_kubeconfig(tmp_path / "kc")
        pull_lever(client.CoreV1Api(api_client(ClusterRef(str(kc), None))), HaltLever("sre@ops", 1.0, "game day over"))
        before = len(api.requests)
        env = _cron_env(c, tmp_path, tmp_path / "results", KUBECONFIG=str(kc))
        halted = subprocess.run([*c["command"], *c["args"]], env=env, capture_output=True, text=True, timeout=120)
    assert halted.returncode == 4 and "Traceback" not in halted.stderr, halted.stdout + halted.stderr
    said = " ".join(halted.stderr.split())
    assert "refused: chaoskit is halted in cluster " in said and "by sre@ops: game day over" in said, said
    assert not (tmp_path / "results").exists() and {r.method for r in api.requests[before:]} == {"GET"}  # read only


def test_the_cronjobs_command_runs_the_suite_into_a_new_results_directory(tmp_path):
    """Not halted: `chaoskit run SUITE... --pushgateway URL --ci --out RESULTS/runs/TIME`, the oldest results
    beyond CHAOSKIT_KEEP_RUNS pruned first (chaoskit here a stand-in script recording its arguments)."""
    import subprocess

    c = _cronjob()[1]["spec"]["jobTemplate"]["spec"]["template"]["spec"]["containers"][0]
    results, bin_dir = tmp_path / "results", tmp_path / "bin"
    for old in ("20261201T030000Z", "20261202T030000Z", "20261203T030000Z"):
        (results / "runs" / old).mkdir(parents=True)
    bin_dir.mkdir()
    (bin_dir / "chaoskit").write_text('#!/bin/sh\nif [ "$1" = status ]; then echo \'{"halted": []}\'; exit 0; fi\n'
                                      'printf "%s\\n" "$@" > "$ARGS_FILE"\n')
    (bin_dir / "chaoskit").chmod(0o755)
    env = _cron_env(c, tmp_path, results, CHAOSKIT_KEEP_RUNS="2", CHAOSKIT_PUSHGATEWAY="http://pgw:9091",
                    ARGS_FILE=str(tmp_path / "args"))
    env["PATH"] = f"{bin_dir}:{env['PATH']}"
    ran = subprocess.run([*c["command"], *c["args"]], env=env, capture_output=True, text=True, timeout=30)
    assert ran.returncode == 0, ran.stdout + ran.stderr
    out = ran.stdout.split("results: ", 1)[1].split()[0]
    assert Path(out).parent == results / "runs" and len(Path(out).name) == len("20261204T030000Z")
    assert (tmp_path / "args").read_text().splitlines() == ["run", *c["args"], "--pushgateway", "http://pgw:9091",
                                                            "--ci", "--out", out]
    assert sorted(p.name for p in (results / "runs").iterdir()) == ["20261202T030000Z", "20261203T030000Z"]
