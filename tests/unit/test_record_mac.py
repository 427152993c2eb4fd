"""Revert records in the cluster carry an HMAC-SHA256 with the installation's key (Secret chaoskit-record-key,
created on first use): one that was changed, moved, unsigned or signed with another key is refused by
`replay_cluster` and nothing runs on a node for it (FakeKubeApi: no helper pod created)."""

from __future__ import annotations

import base64
import json

import pytest
from kubernetes import client

from chaoskit.executors.k8s_helper import replay_cluster
from chaoskit.executors.k8s_records import (
    RECORD_KEY_SECRET,
    KeyUnavailable,
    RecordRefused,
    SignedRecords,
    canonical,
)
from chaoskit.executors.revert_store import configmap_name
from chaoskit.targets.kube import api_client
from tests.helpers.fake_kube import HELPER_RUN as RUN
from tests.helpers.fake_kube import ApiError, FakeKubeApi, FakeState, helper_placement

CM = ("chaoskit", configmap_name(RUN))


@pytest.fixture(scope="module")
def server():
    with FakeKubeApi() as fake:  # one server for the module (each stop waits up to 0.5 s); a fresh state per test
        yield fake


@pytest.fixture
def api(server, tmp_path):
    server.state, server.requests[:] = FakeState(), []
    server.write_kubeconfig(tmp_path / "kubeconfig")
    return server


def request(cluster, node: str = "node-7") -> dict:
    hp = helper_placement(cluster)
    return {"type": "process.signal", "spec": {"type": "process.signal", "pid": 4242}, "state": "applied",
            "record": {"signal": "SIGSTOP", "targets": [{"pid": 4242, "start": 1}]},
            "placement": {**hp.to_json(), "node": node}, "hold_s": 0.0}


def records(cluster) -> SignedRecords:
    return SignedRecords(client.CoreV1Api(api_client(cluster)), "chaoskit", RUN)


def test_the_key_is_created_once_on_first_use_and_a_signed_record_reads_back(api, cluster):
    req = request(cluster)
    records(cluster).put("k1", req)
    records(cluster).put("k2", req)  # another writer (run) finds the key and keeps it
    assert len(api.calls("POST", "/secrets$")) == 1
    secret = api.state.secrets[("chaoskit", RECORD_KEY_SECRET)]
    assert len(base64.b64decode(secret["data"]["key"])) == 32 and secret["type"] == "Opaque"
    raw = json.loads(api.state.configmaps[CM]["data"]["k1.json"])
    assert raw["mac"].startswith("hmac-sha256:") and len(raw["mac"]) == len("hmac-sha256:") + 64
    assert records(cluster).get("k1") == req and records(cluster).get("none") is None
    assert canonical({"b": 1, "a": "é"}) == b'{"a":"\\u00e9","b":1}'


def _tamper(api: FakeKubeApi, how: str) -> None:
    data = api.state.configmaps[CM]["data"]
    genuine = data["k1.json"]
    if how == "one byte":
        data["k1.json"] = genuine.replace('"SIGSTOP"', '"SIGSTOQ"')
    elif how == "no mac":
        data["k1.json"] = json.dumps({k: v for k, v in json.loads(genuine).items() if k != "mac"})
    elif how == "moved to another key":
        data["k9.json"] = data.pop("k1.json")
    elif how == "not JSON":
        data["k1.json"] = genuine[:-1]
    elif how == "another key":
        api.state.secrets[("chaoskit", RECORD_KEY_SECRET)]["data"]["key"] = base64.b64encode(b"x" * 32).decode()
    elif how == "no key":
        del api.state.secrets[("chaoskit", RECORD_KEY_SECRET)]


@pytest.mark.parametrize("how, why", [
    ("one byte", "fails its MAC check"), ("no mac", "carries no MAC"), ("moved to another key", "fails its MAC"),
    ("not JSON", "is not JSON"), ("another key", "fails its MAC check"), ("no key", "there is no key Secret")])
def test_a_record_that_does_not_check_is_refused_and_nothing_runs(api, cluster, how, why):
    records(cluster).put("k1", request(cluster))
    _tamper(api, how)
    (result,) = replay_cluster(cluster)
    assert result.refused and result.configmap == CM[1] and why in result.error, result.error
    assert f"revert record chaoskit/{CM[1]} key {result.key}.json" in result.error
    assert api.calls("POST", "/pods") == [] and api.calls("DELETE", "/configmaps") == []  # kept for a look
    if how not in ("no key", "another key"):  # the run's own revert from the cluster's copy refuses it too
        with pytest.raises(RecordRefused, match=why):
            records(cluster).get(result.key)


def test_a_key_chaoskit_may_not_read_is_a_clear_error(api, cluster, monkeypatch):
    records(cluster).put("k1", request(cluster))

    def forbidden(*_):
        raise ApiError(403, "Forbidden", 'secrets "chaoskit-record-key" is forbidden')

    monkeypatch.setattr(api, "get_secret", forbidden)
    with pytest.raises(KeyUnavailable, match=r"cannot read the revert records' key, Secret chaoskit/chaoskit-record-"
                                             r"key \(403 Forbidden\): the chaoskit Role must grant it"):
        replay_cluster(cluster)
    assert api.calls("POST", "/pods") == []


def test_status_lists_a_record_that_does_not_check_as_refused(api, cluster):
    from chaoskit.executors.k8s_halt import cluster_runs

    core = client.CoreV1Api(api_client(cluster))
    records(cluster).put("k1", {**request(cluster), "host": "ci-7"})
    records(cluster).put("k2", request(cluster, node="node-9"))
    assert [f.state for f in cluster_runs(core)[0].faults] == ["applied", "applied"]
    _tamper(api, "one byte")
    (run,) = cluster_runs(core)
    assert [(f.node, f.state) for f in run.faults] == [
        ("node-7", "REFUSED by rollback --cluster: fails its MAC check"), ("node-9", "applied")]
    assert run.host == "ci-7"


def test_a_record_still_applying_is_reported_unknown_and_kept(api, cluster):
    """Its host stopped between the apply helper's run and the record coming back: nothing says the fault is
    gone, so rollback --cluster must not call it reverted nor delete its key."""
    req = {**request(cluster), "state": "applying", "record": None}
    records(cluster).put("k1", req)
    (result,) = replay_cluster(cluster)
    assert not result.refused and result.error.startswith("state unknown: the fault was being applied on node "
                                                          "node-7 when its host stopped")
    assert api.calls("POST", "/pods") == [] and records(cluster).get("k1") == req  # nothing ran; the key is kept
