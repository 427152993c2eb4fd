"""Scale of node-level faults on Kubernetes pods (issue 37 item 5): one helper pod per node, not per pod.

Set-up: FakeKubeApi (tests/helpers/fake_kube.py, a FAKE API server: in-memory, threaded HTTP on 127.0.0.1) with
`KUBE_SCALE_PODS` pods (default 1000) of app=llm spread over `KUBE_SCALE_NODES` nodes (default 100), and one
`process.signal` SIGSTOP fault on every one of them (mode all, a lifetime: its apply helpers hold it), driven
through the real k8s-helper executor and the real `kubernetes` client: place + plan, apply, observe, revert from
the ledger's record, then a second apply and `rollback --cluster`'s replay from the cluster's signed records alone.

The helper pods are answered by a FAKE kubelet (`instant_agent`) that does not run `python -m chaoskit.agent`: it
answers each verb from the request the way the agent does for a node's pods (the same record shape), at once.
Running 100 real agents per verb (a Python process each, ~1 s of start-up on this 2-core machine, and stand-in
containers for 1,000 pods) would measure this machine's process start-up, not chaoskit's API traffic; the real
agent on several pods of one node is tested in tests/integration/test_kube_node_faults.py. So the times here
are chaoskit's and the API server's side only: on a real cluster add a helper pod's scheduling and start-up
(seconds), once per verb since every node's helper runs at once.

RESULT keys: pods, nodes; {plan,apply,observe,rollback,rollback_cluster}_s (wall time of each phase; plan is
choosing the pods (one LIST, read into the client's models) and planning, after a first placement that imported
those models, as a run's preflight does before the step places the fault again);
calls_{...} (API requests the phase sent); helpers_{apply,observe,revert,revert_cluster} (helper pods created);
helpers_per_node_max (the most helper pods any node got for one verb); per_pod_design_helpers (what one helper
per pod cost: N holders + 2N observers + N reverters); left_pods, left_configmaps (after both rollbacks: 0);
goal_met (True: at most one helper pod per node per verb, each rollback within 30 s, nothing left; exit 1 when
missed). `KUBE_SCALE_PODS=20 KUBE_SCALE_NODES=4` is a few-second run; `--goal key=value` sets a limit (bench/goals.py).
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from chaoskit.executors.k8s_helper import K8sHelperExecutor, replay_cluster  # noqa: E402
from chaoskit.executors.layer import place  # noqa: E402
from chaoskit.injectors.base import FaultContext  # noqa: E402
from chaoskit.injectors.process.fault import ProcessSignal  # noqa: E402
from chaoskit.targets.kube import ClusterRef  # noqa: E402
from tests.helpers.fake_kube import FakeKubeApi  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from goals import Goal, Goals  # noqa: E402

GOALS = Goals(Goal("helpers_per_node_max", "<=", 1, "helper pods a node gets for one verb"),
              Goal("rollback_s", "<=", 30.0, "revert of every pod's fault from the ledger's record"),
              Goal("rollback_cluster_s", "<=", 30.0, "`rollback --cluster`'s replay"),
              Goal("left_pods", "<=", 0, "helper pods left after both rollbacks"),
              Goal("left_configmaps", "<=", 0, "configmaps left after both rollbacks"))


def instant_agent(pod: dict[str, Any]) -> tuple[str, str]:
    """A FAKE kubelet that answers a helper pod the way `python -m chaoskit.agent` answers for a node's pods,
    without running it: apply -> each pod's record (a holding apply stays Running), revert -> each reverted,
    observe -> each in effect."""
    (c,) = pod["spec"]["containers"]
    verb = c["command"][3]
    request = json.loads(next(e["value"] for e in c["env"] if e["name"] == "CHAOSKIT_REQUEST"))
    names = [t["pod"] for t in request["placement"]["targets"]]
    if verb == "apply":
        record = {"pods": [{"pod": n, "record": {"signal": "SIGSTOP", "targets": []}} for n in names]}
        return ("Running" if request.get("hold_s") else "Succeeded"), json.dumps({"record": record}) + "\n"
    if verb == "revert":
        return "Succeeded", json.dumps({"reverted": True, "pods": dict.fromkeys(names, "reverted")}) + "\n"
    pods = {n: {"in_effect": True} for n in names}
    return "Succeeded", json.dumps({"in_effect": True, "details": {"pods": pods}}) + "\n"


def seed(api: FakeKubeApi, pods: int, nodes: int) -> None:
    for n in range(nodes):
        api.add_node(f"node-{n:03d}")
    for i in range(pods):
        api.add_pod("prod", f"llm-{i:04d}", {"app": "llm"}, node=f"node-{i % nodes:03d}")


def fault(kubeconfig: Path, run_id: str) -> ProcessSignal:
    spec = ProcessSignal.Spec.model_validate({"type": "process.signal", "signal": "SIGSTOP", "kubernetes": {
        "namespace": "prod", "selector": {"app": "llm"}, "mode": "all", "kubeconfig": str(kubeconfig)}})
    return ProcessSignal(spec, FaultContext(lifetime_s=600.0, run_id=run_id))


class Meter:
    """Wall time, API requests and helper pods created (per verb, per node) of each phase."""

    def __init__(self, api: FakeKubeApi):
        self.api, self.result, self.per_node_max = api, {}, 0

    def phase(self, name: str, fn: Callable[[], Any], verb: str | None = None) -> Any:
        before, t0 = len(self.api.requests), time.perf_counter()
        out = fn()
        self.result[f"{name}_s"] = time.perf_counter() - t0
        sent = self.api.requests[before:]
        self.result[f"calls_{name}"] = len(sent)
        if verb is not None:
            made = [r.body for r in sent if r.method == "POST" and r.path.endswith("/namespaces/chaoskit/pods")]
            self.result[f"helpers_{name.replace('rollback', 'revert')}"] = len(made)
            per_node = Counter(b["spec"]["nodeName"] for b in made)
            self.per_node_max = max(self.per_node_max, *per_node.values(), 0)
        return out


def main() -> int:
    pods, nodes = int(os.environ.get("KUBE_SCALE_PODS", 1000)), int(os.environ.get("KUBE_SCALE_NODES", 100))
    executor = K8sHelperExecutor()
    with FakeKubeApi() as api, tempfile.TemporaryDirectory() as tmp:
        api.kubelet = instant_agent
        seed(api, pods, nodes)
        kubeconfig = api.write_kubeconfig(Path(tmp) / "kubeconfig")
        place(fault(kubeconfig, "warm-up"))  # the client's models are imported on first use: ~2 s, once a process
        m = Meter(api)
        inj = fault(kubeconfig, "kube-scale-1")

        def plan() -> list[str]:
            place(inj)
            return executor.plan(inj)

        lines = m.phase("plan", plan)
        record = m.phase("apply", lambda: executor.apply(inj, executor.prepare(inj), inj.ctx.placement), "apply")
        details = m.phase("observe", lambda: executor.observe_details(inj.type, record, inj.ctx.placement), "observe")
        m.phase("rollback", lambda: executor.revert(inj.type, record, inj.ctx.placement), "revert")
        assert len(record["pods"]) == pods and len(details["pods"]) == pods and len(lines) == nodes + 1

        again = fault(kubeconfig, "kube-scale-2")
        place(again)
        executor.apply(again, executor.prepare(again), again.ctx.placement)
        replayed = m.phase("rollback_cluster", lambda: replay_cluster(ClusterRef(str(kubeconfig), None)), "revert")
        assert len(replayed) == nodes and not [r for r in replayed if r.error], replayed[:3]
        r = m.result
        r.update(pods=pods, nodes=nodes, helpers_per_node_max=m.per_node_max, per_pod_design_helpers=4 * pods,
                 left_pods=sum(1 for ns, _ in api.state.pods if ns == "chaoskit"),
                 left_configmaps=len(api.state.configmaps))
    print(f"{pods} pods on {nodes} nodes, one process.signal fault on every pod (fake API server, fake kubelet):")
    for phase in ("plan", "apply", "observe", "rollback", "rollback_cluster"):
        helpers = r.get(f"helpers_{phase.replace('rollback', 'revert')}", 0)
        print(f"  {phase:17s} {r[f'{phase}_s']:7.2f} s  {r[f'calls_{phase}']:5d} API calls  {helpers:4d} helper pods")
    return GOALS.result({k: f"{v:.3f}" if isinstance(v, float) else v for k, v in sorted(r.items())})


if __name__ == "__main__":
    sys.exit(main())
