"""Bundled experiments (reference/, network/) run by name, as is, against `chaoskit ref up --netns`."""

from __future__ import annotations

import json
import os
import subprocess
import urllib.request
from pathlib import Path

import pytest

from chaoskit.paths import experiment_path
from chaoskit.reference.deploy import Deployment, RefOptions
from tests.conftest import chaoskit, proc_state, requires_triton, wait_for

pytestmark = [requires_triton,
              pytest.mark.skipif(os.geteuid() != 0, reason="--netns needs root")]


@pytest.fixture(scope="module")
def ref(tmp_path_factory):
    d = Deployment(tmp_path_factory.mktemp("ref"))
    facts = d.up(RefOptions(port=18600, netns=True), say=lambda _m: None)
    yield d.root, facts
    d.down(say=lambda _m: None)
    assert not any(n.startswith(f"ckref{d.tag}") for n in os.listdir("/run/netns"))


def ns_state(ns: str) -> tuple[str, str]:
    tc = subprocess.run(["ip", "netns", "exec", ns, "tc", "-j", "qdisc", "show"], capture_output=True, text=True)
    nft = subprocess.run(["ip", "netns", "exec", ns, "nft", "-j", "list", "ruleset"], capture_output=True, text=True)
    return tc.stdout, json.dumps([x for x in json.loads(nft.stdout)["nftables"] if "metainfo" not in x])


def run(ref, tmp_path, state_dir, experiment: str) -> tuple[int, dict, str]:
    root, _ = ref
    os.environ["CHAOSKIT_REF_DIR"] = str(root)
    try:
        p = chaoskit("run", experiment, "--var", "duration=3s", "--out", str(tmp_path / "o"), state=state_dir)
        out, err = p.communicate(timeout=120)
    finally:
        del os.environ["CHAOSKIT_REF_DIR"]
    summary = json.loads((tmp_path / "o" / "summary.json").read_text())
    return p.returncode, summary, out + err


EXPECTED = {"bandwidth": 0, "drop": 0, "partition": 1, "proxy-latency": 0}  # as each file's header states


def in_rotation(facts: dict) -> bool:
    """Every replica gets the gateway's traffic (none still ejected by an earlier experiment's fault)."""
    with urllib.request.urlopen(f"{facts['url']}/gateway/status", timeout=5) as r:
        return all(x["healthy"] for x in json.loads(r.read())["replicas"])


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_network_experiment_verdict_and_the_namespace_as_it_was(ref, tmp_path, state_dir, name):
    _, facts = ref
    header = experiment_path(Path(f"network/{name}")).read_text()
    assert f"# Expected: {'held (exit 0)' if EXPECTED[name] == 0 else 'deviated (exit 1)'}" in header
    before = ns_state(facts["netns"])
    # the verdicts assume both replicas in rotation: a partition while replica 0 is still ejected cuts nothing
    wait_for(lambda: in_rotation(facts), timeout=15, every=0.2)
    code, summary, out = run(ref, tmp_path, state_dir, f"network/{name}")
    assert code == EXPECTED[name], out
    fault = summary["faults"][0]
    assert summary["rollback_complete"] and fault["applied_at"] and fault["observed_before_revert"]["in_effect"]
    assert ns_state(facts["netns"]) == before


def test_stall_one_replica(ref, tmp_path, state_dir):
    _, facts = ref
    code, summary, out = run(ref, tmp_path, state_dir, "reference/stall-one-replica")
    assert code == 1, out  # documented: requests reach the frozen replica until the health checks eject it
    assert summary["rollback_complete"] and summary["recovery_s"] is not None
    assert proc_state(facts["replica_pid"]) in ("S", "R")


DELAYED = """\
apiVersion: chaoskit/v1
kind: Experiment
metadata: {name: delay-everything}
target: {reference: triton}
steadyState:
  probes:
    - name: slo
      type: slo
      load: {url: "{target.replica_url}", api: triton, model: tiny_lm, rate: 10, duration: 1s, timeout: 1s}
      expect: {completed_ratio: "> 0.9"}
  during: {every: 1s}
  after: {within: 10s, every: 500ms}
method:
  - name: delay-200s
    inject: {type: network.netem, target: {netns: "{target.netns}"}, delay: 200s}
    duration: 5s  # a during sample (1 s of load, its 1 s timeout) ends inside it on a loaded host too
"""


def test_a_fault_in_effect_is_judged_and_a_200s_delay_deviates(ref, tmp_path, state_dir):
    """issue 43: `delay: 200` (meant as ms) applied 200 s and the run held, its samples labelled between/grace.
    Every sample taken while the fault was in effect is a judged during sample, and the run deviates."""
    root, facts = ref
    exp = tmp_path / "delay.yaml"
    exp.write_text(DELAYED)
    before = ns_state(facts["netns"])
    p = chaoskit("run", str(exp), "--out", str(tmp_path / "o"), state=state_dir, env={"CHAOSKIT_REF_DIR": str(root)})
    out, err = p.communicate(timeout=120)
    assert p.returncode == 1, out + err
    events = [json.loads(line) for line in (tmp_path / "o" / "journal.jsonl").read_text().splitlines()]
    fault = next(e for e in events if e["event"] == "fault_applied")
    reverted = next(e["t"] for e in events if e["event"] == "fault_reverted")
    samples = [e for e in events if e["event"] == "sample" and e["probe"] == "slo"]
    overlapping = [s for s in samples if s["t"] <= reverted and s["t"] + s["duration_ms"] / 1000 >= fault["applied_at"]]
    assert overlapping and all(s["phase"] == "during" for s in overlapping), samples
    assert any(s["verdict"] == "fail" for s in overlapping)
    assert any(d.startswith("slo deviated during the method") for d in json.loads(
        (tmp_path / "o" / "summary.json").read_text())["deviations"])
    assert ns_state(facts["netns"]) == before
