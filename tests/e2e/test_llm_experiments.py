"""The bundled llm/ experiments through the CLI against the reference Triton: truncated-stream.yaml holds (exit 0, as its
header documents) - the slo probe counts the cut streams as stream_truncated at the proxy's share - and the
run leaves no proxy behind."""

from __future__ import annotations

import json

import pytest

from chaoskit.reference.deploy import Deployment, RefOptions
from chaoskit.targets.process import all_pids, cmdline
from tests.conftest import chaoskit, free_port, requires_triton

pytestmark = requires_triton


@pytest.fixture(scope="module")
def ref(tmp_path_factory):
    d = Deployment(tmp_path_factory.mktemp("llm-e2e-ref"))
    d.up(RefOptions(port=18740, replicas=1), say=lambda _m: None)  # the experiment's settings: reused as is
    yield d.root
    d.down(say=lambda _m: None)


def test_truncated_stream_experiment_holds_and_counts_the_cuts(ref, tmp_path, state_dir, monkeypatch):
    monkeypatch.setenv("CHAOSKIT_REF_DIR", str(ref))
    port = free_port()
    p = chaoskit("run", "llm/truncated-stream", "--var", "duration=6s", "--var",
                 f"proxy_port={port}", "--out", str(tmp_path / "o"), state=state_dir)
    out, err = p.communicate(timeout=120)
    summary = json.loads((tmp_path / "o" / "summary.json").read_text())
    assert p.returncode == 0, out + err  # held, as documented in the experiment's header
    assert summary["verdict"] == "held" and summary["rollback_complete"]
    fault = summary["faults"][0]
    cut = fault["observed_before_revert"]["faults"]["cut"]
    assert fault["type"] == "llm.proxy" and cut["applied"] > 0 and 0.15 <= cut["applied_share"] <= 0.35
    during = [s for s in summary["samples"] if s["probe"] == "streams-through-proxy" and s["phase"] == "during"]
    assert during and all(s["values"]["errors.stream_truncated"] > 0 for s in during)
    assert not [pid for pid in all_pids() if "chaoskit.injectors.llm_proxy_server" in cmdline(pid)
                and f"127.0.0.1:{port}" in cmdline(pid)]
