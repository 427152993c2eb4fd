"""targets/kube.py through the real kubernetes client against FakeKubeApi: modes, determinism, placements,
Running pods only, clear errors, and the kubeconfig lookup (none: preflight error, exit 4)."""

from __future__ import annotations

import pytest
from kubernetes import client
from pydantic import ValidationError

from chaoskit.errors import EXIT_PREFLIGHT, PreflightError
from chaoskit.targets.kube import ClusterRef, KubeCluster, KubeSelector, api_client, choose, how_many, resolve_cluster
from tests.helpers.fake_kube import TOKEN, FakeKubeApi


@pytest.fixture
def api(no_kube_env):
    with FakeKubeApi() as fake:
        for i in range(5):
            fake.add_pod("prod", f"web-{i}", {"app": "web", "tier": "front"}, node=f"node-{i % 2}",
                         containers=("app", "sidecar"))
        fake.add_pod("prod", "web-pending", {"app": "web", "tier": "front"}, phase="Pending")
        fake.add_pod("prod", "db-0", {"app": "db"})
        fake.add_pod("staging", "web-x", {"app": "web", "tier": "front"})
        yield fake


@pytest.fixture
def core(api, tmp_path):
    kc = api.write_kubeconfig(tmp_path / "kubeconfig")
    return client.CoreV1Api(api_client(resolve_cluster(KubeCluster(kubeconfig=str(kc)))))


def sel(**kw) -> KubeSelector:
    return KubeSelector(namespace="prod", selector={"app": "web", "tier": "front"}, **kw)


@pytest.mark.parametrize(("mode", "value", "count"), [("one", None, 1), ("all", None, 5), ("fixed", 2, 2),
                                                      ("percent", 50, 3), ("percent", 10, 1), ("percent", 100, 5)])
def test_modes_choose_that_many_running_pods(core, mode, value, count):
    chosen = choose(core, sel(mode=mode, value=value))
    assert len(chosen) == count
    assert {p.pod for p in chosen} <= {f"web-{i}" for i in range(5)}  # never Pending, other labels or namespaces


def test_the_choice_is_deterministic_for_a_seed_and_varies_with_it(core):
    picks = {seed: tuple(p.pod for p in choose(core, sel(mode="fixed", value=2, seed=seed))) for seed in range(8)}
    assert picks[3] == tuple(p.pod for p in choose(core, sel(mode="fixed", value=2, seed=3)))
    assert len(set(picks.values())) > 1
    assert all(list(v) == sorted(v) for v in picks.values())


def test_placement_names_pod_uid_node_and_container_id(api, core):
    (p,) = choose(core, sel(mode="all", container="sidecar"))[:1]
    pod = api.state.pods[("prod", p.pod)]
    status = next(s for s in pod["status"]["containerStatuses"] if s["name"] == "sidecar")
    assert p.to_json() == {"namespace": "prod", "pod": p.pod, "uid": pod["metadata"]["uid"],
                           "node": pod["spec"]["nodeName"], "container": "sidecar",
                           "container_id": status["containerID"]}
    assert choose(core, sel())[0].container == "app"  # default: the pod's first container


def test_the_real_client_sends_the_selector_and_token(api, core):
    choose(core, sel())
    (req,) = api.calls("GET", r"/api/v1/namespaces/prod/pods$")
    assert req.query["labelSelector"] == "app=web,tier=front"
    assert req.authorization == f"Bearer {TOKEN}"


def test_no_match_and_too_few_are_clear_errors(core):
    with pytest.raises(PreflightError) as e:
        choose(core, KubeSelector(namespace="prod", selector={"app": "nope"}))
    assert str(e.value) == "kubernetes: no Running pod matches pods app=nope in namespace prod"
    with pytest.raises(PreflightError, match="mode fixed asks for 6 pods but only 5 Running pods match"):
        choose(core, sel(mode="fixed", value=6))
    with pytest.raises(PreflightError, match="has no container 'gpu' \\(it has app, sidecar\\)"):
        choose(core, sel(container="gpu"))


@pytest.mark.parametrize(("kw", "why"), [({"mode": "fixed"}, "mode fixed: value must be a whole number"),
                                         ({"mode": "fixed", "value": 1.5}, "mode fixed: value must be"),
                                         ({"mode": "percent", "value": 150}, "mode percent: value must be"),
                                         ({"mode": "one", "value": 1}, "mode one: takes no value"),
                                         ({"mode": "some"}, "mode")])
def test_spec_rejects_a_value_that_does_not_fit_the_mode(kw, why):
    with pytest.raises(ValidationError, match=why):
        sel(**kw)


def test_how_many():
    assert [how_many("percent", 34, 3), how_many("percent", 33, 3), how_many("fixed", 2, 9)] == [2, 1, 2]


def test_without_a_kubeconfig_preflight_fails_with_exit_4_and_the_reason(no_kube_env, tmp_path):
    with pytest.raises(PreflightError) as e:
        resolve_cluster(KubeCluster())
    assert e.value.exit_code == EXIT_PREFLIGHT
    assert str(e.value) == (f"kubernetes: no kubeconfig found ($KUBECONFIG (unset), {tmp_path}/home/.kube/config) "
                            "and not running in a pod ($KUBERNETES_SERVICE_HOST unset); set kubeconfig: in the "
                            "target or export KUBECONFIG")
    with pytest.raises(PreflightError, match="kubeconfig /nonexistent/kc does not exist"):
        resolve_cluster(KubeCluster(kubeconfig="/nonexistent/kc"))


def test_a_fault_whose_pods_cannot_be_chosen_says_why_it_has_no_plan(no_kube_env):
    """Not what its local code makes of a target it cannot reach (`ValueError: ... reached through a helper pod`)."""
    from chaoskit.engine.plan import plan_faults
    from chaoskit.experiment.loader import load_experiment
    from chaoskit.paths import library

    exp = load_experiment(library("experiments") / "kubernetes" / "pod-network-latency.yaml").experiment
    _, (step,), (problem,) = plan_faults(exp.method)
    assert problem.startswith("network.netem: kubernetes: no kubeconfig found")
    assert step.changes == [f"(no plan: the pods could not be chosen: {problem})"]


def test_kubeconfig_env_and_a_bad_context(api, tmp_path, monkeypatch: pytest.MonkeyPatch):
    kc = api.write_kubeconfig(tmp_path / "kc-env")
    monkeypatch.setenv("KUBECONFIG", str(kc))
    ref = resolve_cluster(KubeCluster(context="nope"))
    assert ref == ClusterRef(str(kc.resolve()), "nope")
    with pytest.raises(PreflightError, match="kubernetes: cannot use .*kc-env"):
        api_client(ref)
