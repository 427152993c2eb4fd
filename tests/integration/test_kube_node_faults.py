"""Node-level faults on Kubernetes pods, end to end: `chaoskit run` of network.partition and process.signal with
a `kubernetes:` target chooses pods through FakeKubeApi, runs each verb in a helper pod (its FAKE kubelet runs
the real `python -m chaoskit.agent` on this host), and the agent finds each pod's container among this host's
processes by its CRI ID (stand-in containers: real processes in real namespaces and cgroups), applies the real
nft table / SIGSTOP there, and reverts it; nothing is left in the namespaces, the processes or the cluster."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import pytest
from kubernetes import client

from chaoskit.errors import PreflightError
from chaoskit.executors.k8s_helper import K8sHelperExecutor, replay_cluster
from chaoskit.executors.layer import place
from chaoskit.injectors.base import FaultContext
from chaoskit.injectors.cpu.fault import CpuThrottle
from chaoskit.injectors.disk.throttle import DiskThrottle
from chaoskit.injectors.firewall.fault import Partition
from chaoskit.injectors.memory.limit import MemoryLimit
from chaoskit.injectors.process.fault import ProcessSignal
from chaoskit.targets.blockdev import resolve_path
from chaoskit.targets.cgroups import CpuHierarchy, find_cpu_hierarchy, find_io_hierarchy, find_mem_hierarchy
from chaoskit.targets.container import ContainerNotFound, bare_id, container_cgroup, container_pids
from chaoskit.targets.kube import api_client, resolve_cluster
from tests.conftest import chaoskit, ledgers, proc_state, wait_for, write
from tests.helpers import standin_container
from tests.helpers.fake_kube import FakeKubeApi, run_pod_here
from tests.helpers.netpair import Pair

PORT = 18081
EXPERIMENT = f"""\
apiVersion: chaoskit/v1
kind: Experiment
metadata: {{name: kube-node-faults}}
steadyState:
  probes:
    - name: web-ready
      type: kube.pods
      target: {{kubernetes: {{namespace: prod, selector: {{app: web}}}}}}
      expect: {{ready: ">= 2"}}
method:
  - inject:
      type: pod.kill
      target: {{kubernetes: {{namespace: prod, selector: {{app: web}}, mode: one, seed: 3}}}}
    duration: 1s
  - inject:
      type: network.partition
      target: {{kubernetes: {{namespace: prod, selector: {{app: web}}, mode: all, helper: {{image: "reg/ck:1"}}}}}}
      ports: [{PORT}]
    duration: 3s
  - inject:
      type: process.signal
      kubernetes: {{namespace: prod, selector: {{app: web}}, mode: all}}
      signal: SIGSTOP
    duration: 3s
"""

pytestmark = pytest.mark.usefixtures("no_kube_env")


@pytest.fixture
def pods():
    """Two pods of app=web, on node-a and node-b: stand-in containers in the two namespaces of a veth pair."""
    root = standin_container.hierarchy_or_skip()
    pair = Pair()
    made = []
    also = []  # the container's cpu, memory and io cgroups too, for cpu_throttle, memory_limit and disk.throttle
    for find in (find_cpu_hierarchy, find_mem_hierarchy, find_io_hierarchy):
        try:
            also.append(find().root)
        except PreflightError:
            pass
    try:
        for ns in (pair.srv, pair.cli):
            made.append(standin_container.start(ns, root, also=tuple(also)))
        wait_for(lambda: all(len(c.pids()) == 2 for c in made), timeout=10)
        yield pair, made
    finally:
        for c in made:
            c.stop()
        pair.close()


@contextmanager
def web_pods(containers: list, tmp_path, run_helpers: bool = True,
             nodes: str = "ab") -> Iterator[tuple[FakeKubeApi, str]]:
    """FakeKubeApi with pods web-0 (node-a) and web-1 (node-b; `nodes="aa"`: node-a too) of app=web in prod,
    whose containers are the stand-ins; the helper pods asked for run on this host (unless not run_helpers).
    Yields it and the path of its kubeconfig."""
    with FakeKubeApi() as api:
        if run_helpers:
            api.kubelet = run_pod_here
        for i, c in enumerate(containers):
            api.add_pod("prod", f"web-{i}", {"app": "web"}, node=f"node-{nodes[i]}", container_ids=(c.container_id,))
        yield api, str(api.write_kubeconfig(tmp_path / "kubeconfig"))


def chaoskit_tables(pair: Pair, ns: str) -> list[str]:
    return [x["table"]["name"] for x in pair.ruleset(ns) if "table" in x and x["table"]["name"].startswith("chaoskit")]


def while_running(run: subprocess.Popen, cond: Callable[[], bool]) -> None:
    """Wait for cond while the run goes on; a run that ended first fails the test with its output."""
    def seen() -> bool:
        if run.poll() is not None:
            raise AssertionError(f"the run ended (exit {run.returncode}) first: {run.communicate()}")
        return cond()

    wait_for(seen, timeout=90)


def test_the_agent_finds_a_containers_processes_by_its_cri_id(pods):
    _, (one, _) = pods
    found = container_pids(one.container_id)
    assert found[0] == one.proc.pid  # the container's init (sh) first, then what it forked (sleep)
    assert sorted(found) == one.pids() and len(found) == 2
    with pytest.raises(ContainerNotFound, match=r"no process of container 0123456789ab on this node"):
        container_pids("containerd://" + "0123456789ab" * 2)
    assert bare_id("cri-o://" + one.id) == one.id
    with pytest.raises(ValueError, match="not a container ID: 'containerd://web'"):
        bare_id("containerd://web")


def test_partition_and_sigstop_of_pods_run_in_helper_pods_and_are_reverted(tmp_path, state_dir, pods, monkeypatch):
    pair, containers = pods
    with web_pods(containers, tmp_path) as (api, kubeconfig):
        api.recreate_deleted = api.keep_container_ids = True
        monkeypatch.setenv("KUBECONFIG", kubeconfig)
        out_dir = tmp_path / "out"
        run = chaoskit("run", str(write(tmp_path / "exp.yaml", EXPERIMENT)), "--plain", "--out", str(out_dir),
                       state=state_dir)
        while_running(run, lambda: all(chaoskit_tables(pair, ns) for ns in (pair.srv, pair.cli)))
        while_running(run, lambda: all(proc_state(pid) == "T" for c in containers for pid in c.pids()))
        assert chaoskit_tables(pair, pair.srv) == []  # the partition ended before the SIGSTOP began
        out, err = run.communicate(timeout=120)
        assert run.returncode == 0, (out, err)
        assert [chaoskit_tables(pair, ns) for ns in (pair.srv, pair.cli)] == [[], []]
        assert all(proc_state(pid) in ("S", "R") for c in containers for pid in c.pids())
        helpers = api.calls("POST", "/namespaces/chaoskit/pods$")
        nodes = [h.body["spec"]["nodeName"] for h in helpers if h.body["metadata"]["labels"]["chaoskit.io/verb"]
                 == "apply"]
        assert nodes == ["node-a", "node-b", "node-a", "node-b"]  # one helper per pod, on its node
        images = {c["image"] for h in helpers for c in h.body["spec"]["containers"]}
        assert images == {"reg/ck:1", "chaoskit:latest"}
        (killed,) = [d[1] for d in api.state.deleted if d[1].startswith("web-")]
        pods_now = sorted(name for ns, name in api.state.pods if ns == "prod")
        assert killed not in pods_now and len(pods_now) == 2
        assert sorted(api.state.pods) == [("prod", p) for p in pods_now]  # every helper pod deleted,
        assert [d[1] for d in api.state.deleted if d[1].startswith("chaoskit-apply")] == [  # the holders last
            h.body["metadata"]["name"] for h in helpers if h.body["metadata"]["name"].startswith("chaoskit-apply")]
        assert api.state.configmaps == {}  # the run's revert records removed once reverted
    journal = [json.loads(line) for line in next(out_dir.rglob("journal.jsonl")).read_text().splitlines()]
    applied = [e for e in journal if e["event"] == "fault_applied"]
    assert [e["executor"] for e in applied] == ["local", "k8s-helper", "k8s-helper"]
    # chosen again when each step starts: the replacement of the killed pod, not the killed one
    assert [sorted(t["pod"] for t in e["placement"]["targets"]) for e in applied[1:]] == [pods_now] * 2
    observed = next(e for e in journal if e["event"] == "fault_observed" and e["type"] == "process.signal"
                    and e["when"] == "applied")
    assert observed["details"]["in_effect"] is True
    assert sorted(w.split("/")[1] for w in observed["details"]["pods"]) == pods_now
    assert ledgers(state_dir) == []  # everything reverted: the ledger is discarded


def test_one_helper_per_node_stops_both_pods_of_its_node_and_a_vanished_pod_does_not_stop_the_rollback(tmp_path,
                                                                                                      pods):
    """Two pods on node-a: one helper pod per verb (the real agent) stops and observes both; one pod vanishes
    (its container gone, the pod deleted); `rollback --cluster`'s replay, from the signed record alone, still
    resumes the other with one revert helper, and removes the holder and the record."""
    _, containers = pods
    with web_pods(containers, tmp_path, nodes="aa") as (api, kubeconfig):
        spec = ProcessSignal.Spec.model_validate({"type": "process.signal", "signal": "SIGSTOP", "kubernetes": {
            "namespace": "prod", "selector": {"app": "web"}, "mode": "all", "kubeconfig": kubeconfig}})
        inj, executor = ProcessSignal(spec, FaultContext(lifetime_s=600.0, run_id="node-test")), K8sHelperExecutor()
        place(inj)
        record = executor.apply(inj, executor.prepare(inj), inj.ctx.placement)
        assert {proc_state(pid) for c in containers for pid in c.pids()} == {"T"}
        (holder,) = {p["holder"] for p in record["pods"]}
        assert [(p["node"], p["pod"]) for p in record["pods"]] == [("node-a", "web-0"), ("node-a", "web-1")]
        details = executor.observe_details(inj.type, record, inj.ctx.placement)
        assert details["in_effect"] is True and sorted(details["pods"]) == ["node-a/web-0", "node-a/web-1"]
        os.killpg(containers[1].proc.pid, signal.SIGKILL)  # its container gone from the node (the fixture
        containers[1].proc.wait(timeout=10)                  # removes its cgroups)
        del api.state.pods[("prod", "web-1")]
        key = inj.ctx.placement.key
        replayed = replay_cluster(resolve_cluster(spec.kubernetes))  # the host is gone: the cluster's record alone
        assert [(r.key, r.error) for r in replayed] == [(f"{key}-node-a", None)]
        assert all(proc_state(pid) in ("S", "R") for pid in containers[0].pids())
        made = [(r.body["metadata"]["labels"]["chaoskit.io/verb"], r.body["spec"]["nodeName"])
                for r in api.calls("POST", "/namespaces/chaoskit/pods$")]
        assert made == [("apply", "node-a"), ("observe", "node-a"), ("revert", "node-a")]
        (reverter,) = [name for _, name in api.state.logs if name.startswith("chaoskit-revert-")]
        said = json.loads(api.state.logs[("chaoskit", reverter)])
        assert said["reverted"] is True and said["pods"]["web-0"] == "reverted" and "web-1" in said["pods"]
        assert ("chaoskit", holder) not in api.state.pods and api.state.configmaps == {}


def test_a_dry_run_plans_helper_pods_per_chosen_pod_and_creates_none(tmp_path, state_dir, pods, monkeypatch):
    _, containers = pods
    with web_pods(containers, tmp_path, run_helpers=False) as (api, kubeconfig):
        monkeypatch.setenv("KUBECONFIG", kubeconfig)
        run = chaoskit("run", str(write(tmp_path / "exp.yaml", EXPERIMENT)), "--plain", "--dry-run", state=state_dir)
        out, err = run.communicate(timeout=120)
        assert run.returncode == 0, (out, err)
        text = " ".join((out + err).split())
        for node, pod in (("node-a", "web-0"), ("node-b", "web-1")):
            assert (f"on node {node}: a helper pod (reg/ck:1, hostPID, capabilities NET_ADMIN, SYS_ADMIN, SYS_PTRACE) "
                    f'applies network.partition {{"ports": [{PORT}]}} to pod prod/{pod} container app') in text, text
        assert api.calls("POST") == []


def test_cpu_throttle_of_pods_limits_each_containers_own_cgroup(tmp_path, pods):
    """On its node the helper finds the container's cgroup by its ID in the host's tree, sets that cgroup's own
    CPU limit (nothing is moved: the container keeps its cgroup, and the pod its accounting), and the revert
    helper puts back the limit it had."""
    _, containers = pods
    hier = find_cpu_hierarchy()
    cgroups = [container_cgroup(hier.root, c.container_id) for c in containers]
    assert [cg.name for cg in cgroups] == [f"cri-containerd-{c.id}.scope" for c in containers]
    before = [hier.read_limit(cg) for cg in cgroups]
    with web_pods(containers, tmp_path) as (api, kubeconfig):
        spec = CpuThrottle.Spec.model_validate({"type": "process.cpu_throttle", "cpu": 0.25, "kubernetes": {
            "namespace": "prod", "selector": {"app": "web"}, "mode": "all", "kubeconfig": kubeconfig}})
        inj, executor = CpuThrottle(spec, FaultContext(lifetime_s=600.0, run_id="cpu-test")), K8sHelperExecutor()
        place(inj)
        record = executor.apply(inj, executor.prepare(inj), inj.ctx.placement)
        try:
            assert [hier.read_limit(cg) for cg in cgroups] == [(25000, 100000)] * 2
            assert all(sorted(CpuHierarchy.procs(cg)) == c.pids() for cg, c in zip(cgroups, containers, strict=True))
            local = [p["record"] for p in record["pods"]]
            assert [(r["cgroup"], r["dedicated"]) for r in local] == [(str(cg), False) for cg in cgroups]
            assert executor.observe(inj.type, record, inj.ctx.placement) is True
        finally:
            executor.revert(inj.type, record, inj.ctx.placement)
        assert [hier.read_limit(cg) for cg in cgroups] == before
        assert executor.observe(inj.type, record, inj.ctx.placement) is False
        assert sorted(api.state.pods) == [("prod", "web-0"), ("prod", "web-1")] and api.state.configmaps == {}
    with pytest.raises(ContainerNotFound, match="no cgroup of container 0123456789ab"):
        container_cgroup(hier.root, "containerd://" + "0123456789ab" * 2)


def test_memory_limit_of_pods_limits_each_containers_own_cgroup(tmp_path, pods):
    _, containers = pods
    hier = find_mem_hierarchy()
    cgroups = [container_cgroup(hier.root, c.container_id) for c in containers]
    before = [hier.limit_files(cg) for cg in cgroups]
    with web_pods(containers, tmp_path) as (api, kubeconfig):
        spec = MemoryLimit.Spec.model_validate({"type": "process.memory_limit", "limit": "64MiB", "kubernetes": {
            "namespace": "prod", "selector": {"app": "web"}, "mode": "all",
            "kubeconfig": kubeconfig}})
        inj, executor = MemoryLimit(spec, FaultContext(lifetime_s=600.0, run_id="mem-test")), K8sHelperExecutor()
        place(inj)
        record = executor.apply(inj, executor.prepare(inj), inj.ctx.placement)
        try:
            assert [hier.read_limit(cg) for cg in cgroups] == [64 << 20] * 2
            assert all(sorted(CpuHierarchy.procs(cg)) == c.pids() for cg, c in zip(cgroups, containers, strict=True))
            assert executor.observe(inj.type, record, inj.ctx.placement) is True
        finally:
            executor.revert(inj.type, record, inj.ctx.placement)
        assert [hier.limit_files(cg) for cg in cgroups] == before
    with pytest.raises(ValueError, match="pressure is not available on pods"):
        MemoryLimit.Spec.model_validate({"type": "process.memory_limit", "limit": "64MiB", "pressure": "8MiB",
                                         "kubernetes": {"namespace": "prod", "selector": {"app": "web"}}})


def test_disk_throttle_of_pods_limits_each_containers_cgroup_on_the_disk_behind_its_path(tmp_path, pods, loopdev):
    """The path is the container's (read through its init's /proc/PID/root on the node); the limit lines go on
    the container's own io cgroup for that disk, and come back as they were."""
    _, containers = pods
    hier, disk = find_io_hierarchy(), resolve_path(loopdev).disk
    cgroups = [container_cgroup(hier.root, c.container_id) for c in containers]
    before = [hier.read_limits(cg, disk) for cg in cgroups]
    with web_pods(containers, tmp_path) as (api, kubeconfig):
        # allow_host: this host's PID 1 (the VM's init) refuses even root a look at its /proc/1/root, so the
        # node-root guard refuses here; the next test asserts that refusal
        spec = DiskThrottle.Spec.model_validate({"type": "disk.throttle", "path": loopdev, "rbps": "1MiB",
                                                 "allow_host": True, "kubernetes": {"namespace": "prod", "selector": {"app": "web"},
                                                                "mode": "all",
                                                                "kubeconfig": kubeconfig}})
        inj, executor = DiskThrottle(spec, FaultContext(lifetime_s=600.0, run_id="disk-test")), K8sHelperExecutor()
        place(inj)
        record = executor.apply(inj, executor.prepare(inj), inj.ctx.placement)
        try:
            assert [hier.read_limits(cg, disk)["rbps"] for cg in cgroups] == [str(1 << 20)] * 2
            local = [p["record"] for p in record["pods"]]
            assert [(r["cgroup"], r["dedicated"], r["dev"]) for r in local] == [(str(cg), False, disk) for cg in cgroups]
            assert executor.observe(inj.type, record, inj.ctx.placement) is True
        finally:
            executor.revert(inj.type, record, inj.ctx.placement)
        assert [hier.read_limits(cg, disk) for cg in cgroups] == before


def test_the_root_disk_guard_on_a_node_does_not_fail_open(loopdev):
    """Through a container's root (/proc/PID/root/...), the guard compares with the node's root, /proc/1/root.
    Where that cannot be looked at, the throttle is refused (without allow_host), not let through."""
    path = f"/proc/{os.getpid()}/root{loopdev}"
    inj = DiskThrottle(DiskThrottle.Spec.model_validate({"type": "disk.throttle", "path": path, "rbps": "1MiB",
                                                         "pid": os.getpid()}))
    try:
        os.stat("/proc/1/root")
    except PermissionError:
        with pytest.raises(PreflightError, match=r"cannot tell which disk holds the node's root \(/proc/1/root"):
            inj.preflight()
        return
    inj.preflight()  # readable: a loop device is not the node's root disk


def test_a_holding_helper_reverts_at_its_deadline_and_on_sigterm_without_chaoskit(tmp_path, pods):
    pair, containers = pods
    with web_pods(containers, tmp_path) as (api, kubeconfig):
        spec = Partition.Spec.model_validate({"type": "network.partition", "ports": [PORT], "target": {
            "kubernetes": {"namespace": "prod", "selector": {"app": "web"}, "mode": "all", "kubeconfig": kubeconfig}}})
        executor = K8sHelperExecutor()
        for lifetime, why in ((2.0, "deadline"), (600.0, "SIGTERM")):
            inj = Partition(spec, FaultContext(lifetime_s=lifetime, run_id="hold-test"))
            place(inj)
            record = executor.apply(inj, executor.prepare(inj), inj.ctx.placement)
            holders = [p["holder"] for p in record["pods"]]
            assert all(chaoskit_tables(pair, ns) for ns in (pair.srv, pair.cli))
            if why == "SIGTERM":  # the pods deleted (a drain, or activeDeadlineSeconds): the kubelet's SIGTERM
                for name in holders:
                    client.CoreV1Api(api_client(resolve_cluster(spec.target.kubernetes))).delete_namespaced_pod(
                        name, "chaoskit")
            # nobody reverts but the helpers that hold the fault
            wait_for(lambda: not any(chaoskit_tables(pair, ns) for ns in (pair.srv, pair.cli)), timeout=30)
            wait_for(lambda h=holders, w=why: all(f'"why": "{w}"' in api.state.logs.get(("chaoskit", n), "") for n in h),
                     timeout=10)
            executor.revert(inj.type, record, inj.ctx.placement)  # idempotent: nothing left; cleans the cluster
        assert sorted(api.state.pods) == [("prod", "web-0"), ("prod", "web-1")]
        assert api.state.configmaps == {}

        # the host died: `chaoskit rollback --cluster` from the cluster's records alone, holders removed too
        inj = Partition(spec, FaultContext(lifetime_s=600.0, run_id="hold-test"))
        place(inj)
        executor.apply(inj, executor.prepare(inj), inj.ctx.placement)
        assert all(chaoskit_tables(pair, ns) for ns in (pair.srv, pair.cli))
        key = inj.ctx.placement.key
        replayed = replay_cluster(resolve_cluster(spec.target.kubernetes))
        assert [(r.key, r.error) for r in replayed] == [(f"{key}-node-a", None), (f"{key}-node-b", None)]  # per node
        assert [chaoskit_tables(pair, ns) for ns in (pair.srv, pair.cli)] == [[], []]
        assert sorted(api.state.pods) == [("prod", "web-0"), ("prod", "web-1")]
        assert api.state.configmaps == {}
