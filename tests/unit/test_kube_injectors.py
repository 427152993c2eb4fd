"""pod.delete, pod.kill, deployment.scale and the kube.pods probe through the real kubernetes client against
FakeKubeApi: exactly which requests they send, what they record, revert and observe."""

from __future__ import annotations

import asyncio

import pytest

from chaoskit.errors import EXIT_PREFLIGHT, PreflightError
from chaoskit.injectors import injector_class
from chaoskit.injectors.kube.fault import DeploymentScale, PodDelete, PodKill
from chaoskit.probes import probe_class
from chaoskit.probes.kube import KubePodsProbe
from tests.helpers.fake_kube import FakeKubeApi


@pytest.fixture
def api(no_kube_env, tmp_path, monkeypatch: pytest.MonkeyPatch):
    with FakeKubeApi() as fake:
        for i in range(3):
            fake.add_pod("prod", f"web-{i}", {"app": "web"}, node=f"node-{i}")
        fake.add_deployment("prod", "web", 3)
        monkeypatch.setenv("KUBECONFIG", str(fake.write_kubeconfig(tmp_path / "kubeconfig")))
        yield fake


def pod_spec(type_: str, **kw):
    return injector_class(type_).Spec.model_validate(
        {"type": type_, "target": {"kubernetes": {"namespace": "prod", "selector": {"app": "web"}, **kw}},
         **({"grace_period": "30s"} if type_ == "pod.delete" else {})})


def scale_spec(replicas: int, deployment: str = "web"):
    return DeploymentScale.Spec.model_validate(
        {"type": "deployment.scale", "replicas": replicas,
         "target": {"kubernetes": {"namespace": "prod", "deployment": deployment}}})


def test_pod_delete_deletes_the_chosen_pod_gracefully_with_its_uid(api):
    inj = PodDelete(pod_spec("pod.delete", mode="one", seed=1))
    inj.preflight()
    record = inj.prepare()
    (chosen,) = record.to_json()["pods"]
    uid = api.state.pods[("prod", chosen["pod"])]["metadata"]["uid"]
    assert inj.plan() == [f"delete pod prod/{chosen['pod']} (uid {uid}, node {chosen['node']}) graceful (grace "
                          "period 30s); its controller recreates it, nothing to revert"]
    assert record.to_json()["grace_period_s"] == 30 and inj.placement().to_json()["pods"] == record.to_json()["pods"]
    final = inj.apply(record)
    assert api.state.deleted == [("prod", chosen["pod"], 30)]
    (req,) = api.calls("DELETE", "/pods/")
    assert req.body["preconditions"] == {"uid": uid} and req.query["gracePeriodSeconds"] == "30"
    assert ("prod", chosen["pod"]) not in api.state.pods and final.to_json()["pods"] == [chosen]
    assert PodDelete.read_record(final.to_json()).pods[0].uid == uid  # the record as apply writes it reads back
    PodDelete.revert(final)  # nothing to take back: no request at all
    assert len(api.requests) == len(api.calls("GET")) + 1
    assert PodDelete.observe(final) is False
    assert PodDelete.observe_details(final) == {"in_effect": False, "deleted": [f"prod/{chosen['pod']}"],
                                                "grace_period_s": 30}


def test_pod_kill_is_a_forced_deletion_and_skips_pods_already_gone(api):
    inj = PodKill(pod_spec("pod.kill", mode="all"))
    inj.preflight()
    record = inj.prepare()
    del api.state.pods[("prod", "web-1")]  # gone between prepare and apply
    final = inj.apply(record)
    assert api.state.deleted == [("prod", "web-0", 0), ("prod", "web-2", 0)]
    assert [p.pod for p in final.pods] == ["web-0", "web-2"]
    with pytest.raises(RuntimeError, match="pod.kill: every chosen pod was gone before it could be deleted"):
        inj.apply(record)


def test_a_pod_recreated_under_the_same_name_is_not_deleted(api):
    inj = PodKill(pod_spec("pod.kill", mode="fixed", value=1))
    record = inj.prepare()
    name = record.to_json()["pods"][0]["pod"]
    api.add_pod("prod", name, {"app": "web"})  # same name, new UID
    with pytest.raises(RuntimeError, match="every chosen pod was gone"):
        inj.apply(record)
    assert api.state.deleted == [] and ("prod", name) in api.state.pods


def test_deployment_scale_applies_observes_and_restores(api):
    inj = DeploymentScale(scale_spec(0))
    inj.preflight()
    assert inj.plan() == ["scale deployment prod/web from 3 to 0 replicas; revert: back to 3"]
    record = inj.prepare()
    assert {k: record.to_json()[k] for k in ("namespace", "deployment", "previous_replicas", "replicas")} == {
        "namespace": "prod", "deployment": "web", "previous_replicas": 3, "replicas": 0}
    inj.apply(record)
    assert api.replicas("prod", "web") == 0 and DeploymentScale.observe(record) is True
    (patch,) = api.calls("PATCH", "/scale$")
    assert patch.content_type == "application/merge-patch+json" and patch.body == {"spec": {"replicas": 0}}
    DeploymentScale.revert(record)
    assert api.replicas("prod", "web") == 3 and DeploymentScale.observe(record) is False
    DeploymentScale.revert(record)  # idempotent: already back, nothing patched
    assert len(api.calls("PATCH", "/scale$")) == 2


def test_deployment_scale_leaves_a_count_someone_else_set_and_a_deleted_deployment(api):
    record = DeploymentScale(scale_spec(1)).prepare()
    DeploymentScale(scale_spec(1)).apply(record)
    api.add_deployment("prod", "web", 5)  # an operator scaled it meanwhile
    DeploymentScale.revert(record)
    assert api.replicas("prod", "web") == 5 and len(api.calls("PATCH", "/scale$")) == 1
    del api.state.deployments[("prod", "web")]
    DeploymentScale.revert(record)  # gone: success
    assert DeploymentScale.observe(record) is False


def test_deployment_scale_of_a_missing_deployment_fails_preflight(api):
    with pytest.raises(PreflightError, match="^deployment.scale: no deployment prod/nope$"):
        DeploymentScale(scale_spec(1, "nope")).preflight()


@pytest.mark.parametrize("make", [lambda: PodDelete(pod_spec("pod.delete")), lambda: PodKill(pod_spec("pod.kill")),
                                  lambda: DeploymentScale(scale_spec(1)),
                                  lambda: KubePodsProbe(probe_spec({}))])
def test_without_a_kubeconfig_every_kube_fault_and_probe_fails_preflight(no_kube_env, make):
    with pytest.raises(PreflightError, match="kubernetes: no kubeconfig found") as e:
        make().preflight()
    assert e.value.exit_code == EXIT_PREFLIGHT


def probe_spec(expect: dict):
    return probe_class("kube.pods").Spec.model_validate(
        {"type": "kube.pods", "name": "web", "expect": expect,
         "target": {"kubernetes": {"namespace": "prod", "selector": {"app": "web"}}}})


def test_kube_pods_probe_counts_ready_restarts_and_events(api):
    api.add_pod("prod", "web-3", {"app": "web"}, ready=False, restarts=4)
    api.add_pod("prod", "web-4", {"app": "web"}, phase="Pending", ready=False)
    api.add_pod("prod", "db-0", {"app": "db"}, restarts=9)
    api.add_event("prod", "web-3", "BackOff", count=4)
    api.add_event("prod", "web-3", "Unhealthy", count=2)
    api.add_event("prod", "web-0", "Unhealthy")
    api.add_event("prod", "db-0", "BackOff", count=7)  # not one of ours
    probe = KubePodsProbe(probe_spec({"ready": ">= 3", "events": {"OOMKilling": "== 0"}}))
    probe.preflight()
    assert asyncio.run(probe.measure()) == {"pods": 5, "running": 4, "ready": 3, "not_ready": 2, "restarts": 4,
                                            "events.BackOff": 4, "events.Unhealthy": 3, "events.OOMKilling": 0}


def test_kube_pods_probe_rejects_unknown_expect_keys():
    with pytest.raises(ValueError, match="unknown key 'healthy'"):
        probe_spec({"healthy": "== 1"})
