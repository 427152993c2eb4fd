"""The k8s-helper executor against FakeKubeApi: the helper pod spec field by field, the revert record's ConfigMap
round trip and cleanup, and loud failures (the agent really running: tests/integration/test_kube_helper.py)."""

from __future__ import annotations

import pytest
from kubernetes import client

from chaoskit.executors.k8s_helper import REQUEST_ENV, HelperFailed, K8sHelperExecutor, helper_pod
from chaoskit.executors.revert_store import RevertStore, configmap_name, dns_label
from chaoskit.targets.kube import Placement, api_client
from tests.helpers.fake_kube import HELPER_RUN as RUN
from tests.helpers.fake_kube import FakeKubeApi, helper_placement


@pytest.fixture
def api(tmp_path):
    with FakeKubeApi() as fake:
        fake.write_kubeconfig(tmp_path / "kubeconfig")
        yield fake


def test_helper_pod_spec_exactly(cluster):
    hp = helper_placement(cluster, deadline_s=90)
    pod = client.ApiClient().sanitize_for_serialization(
        helper_pod("revert", "network.netem", {"type": "network.netem", "record": {"dev": "eth0"}}, hp))
    assert pod["metadata"]["namespace"] == "chaoskit"
    assert pod["metadata"]["name"].startswith("chaoskit-revert-k1-")
    assert pod["metadata"]["labels"] == {"chaoskit.io/run": dns_label(RUN), "chaoskit.io/role": "helper",
                                         "chaoskit.io/verb": "revert", "app.kubernetes.io/managed-by": "chaoskit"}
    spec = pod["spec"]
    assert {k: spec[k] for k in ("nodeName", "hostPID", "restartPolicy", "activeDeadlineSeconds",
                                 "serviceAccountName", "automountServiceAccountToken", "tolerations")} == {
        "nodeName": "node-7", "hostPID": True, "restartPolicy": "Never", "activeDeadlineSeconds": 90,
        "serviceAccountName": "chaoskit-helper", "automountServiceAccountToken": False,
        "tolerations": [{"operator": "Exists"}]}
    assert spec["volumes"] == [{"name": "state", "emptyDir": {"sizeLimit": "64Mi"}}]  # the read-only root's room
    assert "runtimeClassName" not in spec
    (c,) = spec["containers"]
    assert c["image"] == "registry.local/chaoskit:0.9"
    assert c["command"] == ["python", "-m", "chaoskit.agent", "revert", "--env", REQUEST_ENV]
    assert c["env"] == [{"name": REQUEST_ENV, "value": '{"record": {"dev": "eth0"}, "type": "network.netem"}'}]
    assert c["securityContext"] == {"privileged": False, "allowPrivilegeEscalation": False,
                                    "readOnlyRootFilesystem": True, "runAsUser": 0,
                                    "capabilities": {"drop": ["ALL"], "add": ["NET_ADMIN", "NET_RAW", "SYS_ADMIN",
                                                                                "SYS_PTRACE"]}}
    assert c["resources"] == {"requests": {"cpu": "10m", "memory": "64Mi"},
                              "limits": {"cpu": "500m", "memory": "256Mi"}}
    assert c["volumeMounts"] == [{"name": "state", "mountPath": "/var/lib/chaoskit"}]


def test_a_cgroup_fault_gets_the_host_cgroup_tree_and_no_network_capability(cluster):
    pod = client.ApiClient().sanitize_for_serialization(
        helper_pod("apply", "process.cpu_throttle", {"type": "process.cpu_throttle"}, helper_placement(cluster)))
    (c,) = pod["spec"]["containers"]
    assert c["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    assert c["volumeMounts"][1:] == [{"name": "host-0", "mountPath": "/sys/fs/cgroup"}]
    assert pod["spec"]["volumes"][1:] == [{"name": "host-0", "hostPath": {"path": "/sys/fs/cgroup",
                                                                          "type": "Directory"}}]
    unknown = client.ApiClient().sanitize_for_serialization(helper_pod("apply", "disk.fill", {}, helper_placement(cluster)))
    assert unknown["spec"]["containers"][0]["securityContext"]["capabilities"] == {"drop": ["ALL"]}


def test_a_gpu_fault_gets_the_nodes_gpus_through_the_container_toolkit(cluster):
    """Every GPU of the node (the agent picks the target container's), the runtime class asked for, SYS_PTRACE
    to read the target's environment and /dev, and memory for a CUDA context; no GPU for the other faults."""
    hp = helper_placement(cluster, runtime_class="nvidia")
    pod = client.ApiClient().sanitize_for_serialization(
        helper_pod("apply", "gpu.memory_pressure", {"type": "gpu.memory_pressure"}, hp))
    (c,) = pod["spec"]["containers"]
    assert pod["spec"]["runtimeClassName"] == "nvidia"
    assert c["env"][1:] == [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"},
                            {"name": "NVIDIA_DRIVER_CAPABILITIES", "value": "compute,utility"}]
    assert c["securityContext"]["capabilities"] == {"drop": ["ALL"], "add": ["SYS_PTRACE"]}
    assert c["resources"]["limits"] == {"cpu": "1", "memory": "2Gi"}
    pods = [Placement.from_json(p) for p in _pods_on({"node-7": 3})]
    three = hp.model_copy(update={"targets": pods, "on_node": True})  # a holder (CUDA context) per pod
    limits = helper_pod("apply", "gpu.memory_pressure", {}, three).spec.containers[0].resources.limits
    assert limits == {"cpu": "3", "memory": "6Gi"}
    other = client.ApiClient().sanitize_for_serialization(helper_pod("apply", "network.netem", {}, hp))
    assert "runtimeClassName" not in other["spec"]
    assert [e["name"] for e in other["spec"]["containers"][0]["env"]] == [REQUEST_ENV]


def test_revert_store_round_trip_and_cleanup(api, cluster):
    core = client.CoreV1Api(api_client(cluster))
    store = RevertStore(core, "chaoskit", RUN)
    store.put("a", {"type": "t", "record": {"x": 1}})
    store.put("b", {"type": "t", "record": {"x": 2}})
    store.put("a", {"type": "t", "record": {"x": 3}})  # overwrite
    cm = api.state.configmaps[("chaoskit", configmap_name(RUN))]
    assert cm["metadata"]["labels"] == {"chaoskit.io/run": dns_label(RUN), "app.kubernetes.io/managed-by": "chaoskit"}
    assert cm["metadata"]["annotations"] == {"chaoskit.io/run-id": RUN}
    assert store.get("a") == {"type": "t", "record": {"x": 3}} and store.get("zz") is None
    store.remove("a")
    assert set(api.state.configmaps[("chaoskit", configmap_name(RUN))]["data"]) == {"b.json"}
    store.remove("b")
    assert api.state.configmaps == {}
    store.remove("b")  # idempotent
    assert api.calls("DELETE", "/configmaps/") and len(api.calls("DELETE", "/configmaps/")) == 1


def test_a_failing_helper_is_a_loud_error_and_is_still_deleted(api, cluster):
    api.kubelet = lambda pod: ("Failed", '{"error": "RuntimeError: no such qdisc"}\n')
    with pytest.raises(HelperFailed, match=r"on node node-7: revert network.netem Failed: RuntimeError: no such qdisc"):
        K8sHelperExecutor().revert("network.netem", {"dev": "eth0"}, helper_placement(cluster).to_json())
    assert api.state.pods == {} and [r.method for r in api.requests if "/pods" in r.path][-1] == "DELETE"


def test_an_entry_without_placement_fails_clearly():
    with pytest.raises(ValueError, match="k8s-helper: the ledger entry has no placement"):
        K8sHelperExecutor().revert("network.netem", {}, None)


def test_localize_puts_the_containers_processes_or_cgroup_in_place_of_the_kubernetes_target():
    from chaoskit.executors.layer import localize

    kube = {"namespace": "prod", "selector": {"app": "web"}}
    net = {"type": "network.drop", "percent": "5%", "target": {"kubernetes": kube, "interface": "eth0"}}
    assert localize(net, [41, 42]) == {"type": "network.drop", "percent": "5%", "target": {"interface": "eth0",
                                                                                           "pid": 41}}
    sig = {"type": "process.signal", "kubernetes": kube}
    assert localize(sig, [41, 42]) == {"type": "process.signal", "pid": [41, 42]}
    cpu = {"type": "process.cpu_throttle", "cpu": 0.5, "kubernetes": kube}
    assert localize(cpu, cgroup="kubepods/pod1/cri-containerd-ab.scope") == {
        "type": "process.cpu_throttle", "cpu": 0.5, "cgroup": "kubepods/pod1/cri-containerd-ab.scope"}
    assert "kubernetes" in cpu  # the caller's spec is left as it was
    with pytest.raises(ValueError, match="no kubernetes: target"):
        localize({"type": "process.signal", "pid": 3}, [41])


def test_the_containers_own_cgroup_is_told_from_its_monitors_and_mount_units():
    from chaoskit.targets.container import _in_container, is_container_dir

    cid = "ab" * 32
    for own in (cid, f"cri-containerd-{cid}.scope", f"crio-{cid}.scope", f"crio-{cid}", f"docker-{cid}.scope"):
        assert is_container_dir(own, cid), own
    for other in (f"crio-conmon-{cid}.scope", f"{cid}.mount", f"cri-containerd-{cid[:-2]}.scope", "kubepods.slice"):
        assert not is_container_dir(other, cid), other
    assert _in_container(f"0::/kubepods.slice/kubepods-pod1.slice/crio-{cid}.scope\n", cid)
    assert not _in_container(f"0::/kubepods.slice/kubepods-pod1.slice/crio-conmon-{cid}.scope\n", cid)
    assert _in_container(f"4:memory:/kubepods/besteffort/pod1/{cid}/init.scope\n", cid)  # a cgroup below it


def _pods_on(nodes: dict[str, int]) -> list[dict]:
    """targets.kube.Placement JSON of `count` pods per node (web-N), in name order."""
    out, n = [], 0
    for node, count in nodes.items():
        for _ in range(count):
            out.append({"namespace": "prod", "pod": f"web-{n}", "uid": f"u{n}", "node": node, "container": "app",
                        "container_id": f"containerd://{n:064x}"})
            n += 1
    return out


def _node_agent(fail_on: str = ""):
    """A FAKE kubelet answering helper pods as the agent answers for a node's pods (apply fails on `fail_on`)."""
    import json

    def answer(pod: dict) -> tuple[str, str]:
        (c,) = pod["spec"]["containers"]
        request = json.loads(c["env"][0]["value"])
        names = [t["pod"] for t in request["placement"]["targets"]]
        verb = c["command"][3]
        if verb == "apply" and pod["spec"]["nodeName"] == fail_on:
            return "Failed", '{"error": "PodFailed: pod prod/web-9: ContainerNotFound: gone"}\n'
        out = {"apply": {"record": {"pods": [{"pod": n, "record": {"n": n}} for n in names]}},
               "revert": {"reverted": True, "pods": dict.fromkeys(names, "reverted")},
               "observe": {"in_effect": True, "details": {"pods": {n: {"in_effect": True} for n in names}}}}[verb]
        return "Succeeded", json.dumps(out) + "\n"

    return answer


def test_one_helper_per_node_applies_observes_and_reverts_every_pod_on_it(api, cluster):
    """5 pods on 2 nodes: 2 helper pods per verb, each with its node's pods; the ledger record lists each pod's
    record under its node's key; each node's share is signed in the cluster under KEY-NODE; the plan is a line
    per node."""
    import json

    from chaoskit.executors.k8s_records import SignedRecords
    from chaoskit.injectors.base import FaultContext
    from chaoskit.injectors.process.fault import ProcessSignal

    api.kubelet = _node_agent()
    hp = helper_placement(cluster, targets=_pods_on({"node-a": 3, "node-b": 2}))
    assert [(one.node, one.key, [p.pod for p in one.targets or []]) for one in hp.per_node()] == [
        ("node-a", "k1-node-a", ["web-0", "web-1", "web-2"]), ("node-b", "k1-node-b", ["web-3", "web-4"])]
    inj = ProcessSignal(ProcessSignal.Spec.model_validate({"type": "process.signal", "signal": "SIGSTOP",
                                                           "kubernetes": {"namespace": "prod", "selector": {"app": "web"}}}),
                        FaultContext(placement=hp, executor="k8s-helper"))
    executor = K8sHelperExecutor()
    plan = executor.plan(inj)
    assert len(plan) == 3 and plan[0].endswith("applies process.signal {} to 3 pods prod/web-0, prod/web-1, "
                                               "prod/web-2 container app") and "(2)" in plan[2]
    record = executor.apply(inj, executor.prepare(inj), hp.to_json())
    assert [(p["key"], p["pod"], p["record"]) for p in record["pods"]] == [
        (f"k1-node-{'aaabb'[i]}", f"web-{i}", {"n": f"web-{i}"}) for i in range(5)]
    stored = SignedRecords(client.CoreV1Api(api_client(cluster)), "chaoskit", RUN).get("k1-node-a")
    assert stored["state"] == "applied" and [p["pod"] for p in stored["record"]["pods"]] == ["web-0", "web-1", "web-2"]
    assert '"mac": "hmac-sha256:' in api.state.configmaps[("chaoskit", configmap_name(RUN))]["data"]["k1-node-a.json"]
    details = executor.observe_details("process.signal", record, hp.to_json())
    assert details["in_effect"] is True and sorted(details["pods"]) == [
        "node-a/web-0", "node-a/web-1", "node-a/web-2", "node-b/web-3", "node-b/web-4"]
    executor.revert("process.signal", record, hp.to_json())
    made = [(r.body["metadata"]["labels"]["chaoskit.io/verb"], r.body["spec"]["nodeName"],
             len(json.loads(r.body["spec"]["containers"][0]["env"][0]["value"])["placement"]["targets"]))
            for r in api.calls("POST", "/namespaces/chaoskit/pods$")]
    assert made == [(verb, node, n) for verb in ("apply", "observe", "revert") for node, n in (("node-a", 3),
                                                                                                 ("node-b", 2))]
    assert api.state.configmaps == {} and not [k for k in api.state.pods if k[0] == "chaoskit"]


def test_a_node_whose_apply_failed_is_named_and_the_others_are_reverted_from_the_cluster(api, cluster):
    from chaoskit.injectors.base import FaultContext
    from chaoskit.injectors.process.fault import ProcessSignal

    api.kubelet = _node_agent(fail_on="node-b")
    hp = helper_placement(cluster, targets=_pods_on({"node-a": 2, "node-b": 2}))
    inj = ProcessSignal(ProcessSignal.Spec.model_validate({"type": "process.signal", "signal": "SIGSTOP",
                                                           "kubernetes": {"namespace": "prod", "selector": {"app": "web"}}}),
                        FaultContext(placement=hp, executor="k8s-helper"))
    executor = K8sHelperExecutor()
    with pytest.raises(HelperFailed, match=r"apply failed on 1 of 2 node\(s\): helper pod chaoskit/chaoskit-apply-"
                                           r"k1-node-b-\w+ on node node-b: .* pod prod/web-9: ContainerNotFound"):
        executor.apply(inj, executor.prepare(inj), hp.to_json())
    executor.revert("process.signal", executor.prepare(inj), hp.to_json())  # the ledger knows nothing yet
    reverts = [r.body for r in api.calls("POST", "/namespaces/chaoskit/pods$")
               if r.body["metadata"]["labels"]["chaoskit.io/verb"] == "revert"]
    assert [b["spec"]["nodeName"] for b in reverts] == ["node-a"]  # node-b's helper reverted itself
    assert api.state.configmaps == {}


def test_the_agent_reverts_every_pod_of_its_node_and_skips_one_whose_container_is_gone(monkeypatch):
    """A revert that fails on a pod whose container left the node is skipped (the fault went with it); one that
    fails on a pod still there is named once the others were reverted; a failed apply undoes the node's pods."""
    from chaoskit import agent

    reverted = []

    class Stub:
        @classmethod
        def from_ledger(cls, record):  # the record as the verbs take it: this stub's verbs read the dict
            return record

        @classmethod
        def revert(cls, record):
            if record.get("fails"):
                raise OSError(f"cannot revert {record['n']}")
            reverted.append(record["n"])

    monkeypatch.setattr(agent, "injector_class", lambda name: Stub)
    here = {"containerd://" + "ab" * 32}  # no container of that ID runs on this host: "gone"
    pods = [{"pod": p, "container_id": next(iter(here)) if p == "gone" else ""} for p in ("a", "gone", "b")]
    record = {"pods": [{"pod": "a", "record": {"n": "a"}}, {"pod": "gone", "record": {"n": "gone", "fails": True}},
                       {"pod": "b", "record": {"n": "b"}}]}
    out = agent.revert_pods("x", record, pods)
    assert reverted == ["a", "b"] and out["a"] == out["b"] == "reverted"
    assert out["gone"].startswith("skipped: its container is gone from this node (OSError: cannot revert gone)")
    record["pods"][0]["record"]["fails"] = True  # pod a's container is unknown: not known to be gone
    reverted.clear()
    with pytest.raises(agent.PodFailed, match=r"^pod a: OSError: cannot revert a \(2 other pod\(s\) of this node "
                                              r"reverted\)$"):
        agent.revert_pods("x", record, pods)
    assert reverted == ["b"]

    applied = []
    monkeypatch.setattr(agent, "apply", lambda t, spec, rec, pod, lifetime_s=None: (
        applied.append(pod["pod"]) or {"n": pod["pod"]}) if pod["pod"] != "c" else (_ for _ in ()).throw(
        RuntimeError("no such container")))
    reverted.clear()
    with pytest.raises(agent.PodFailed, match=r"^pod prod/c: RuntimeError: no such container$"):
        agent.apply_pods("x", {}, [{"namespace": "prod", "pod": p} for p in ("a", "b", "c")])
    assert applied == ["a", "b"] and reverted == ["b", "a"]  # newest first
