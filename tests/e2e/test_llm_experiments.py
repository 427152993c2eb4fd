"""The bundled llm/ experiments through the CLI against the reference Triton, each with the verdict its header
documents: truncated-stream, mid-stream-stall and retry-storm hold (exit 0), token-delay-tpot and
silent-wrong-answers deviate (exit 1);
each fault was in effect before revert (the proxy's own counters), and no run leaves a proxy behind."""

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


def run_llm(name: str, tmp_path, state_dir, port: int, *overrides: str) -> tuple[int, dict, str]:
    """`chaoskit run llm/<name>` with its proxy on `port`: (exit code, summary.json, stdout + stderr)."""
    args = [a for o in (f"proxy_port={port}", *overrides) for a in ("--var", o)]
    p = chaoskit("run", f"llm/{name}", *args, "--out", str(tmp_path / "o"), state=state_dir)
    out, err = p.communicate(timeout=120)
    return p.returncode, json.loads((tmp_path / "o" / "summary.json").read_text()), out + err


def no_proxy_left(port: int) -> bool:
    return not [pid for pid in all_pids() if "chaoskit.injectors.llm_proxy.server" in cmdline(pid)
                and f"127.0.0.1:{port}" in cmdline(pid)]


def applied(summary: dict, fault: str) -> dict:
    """What the proxy's fault `fault` did, observed before revert (in effect, with its own counters)."""
    observed = summary["faults"][0]["observed_before_revert"]
    assert summary["faults"][0]["type"] == "llm.proxy" and observed["in_effect"], observed
    return observed["faults"][fault]


# The experiments' own 10 s: a continuous probe's first sample (in the grace) takes ~3 s here with its 2 s window,
# and 4-5.3 s on a busy box; it skips the slots it missed, so with 6 s a probe could reach the fault's end without a
# judged sample (truncated-stream in a clean-clone run of f856339: 5.3 s; mid-stream-stall in one of 0bfb6b3:
# 4.07 s), which makes the run deviate. With 10 s a first sample may take up to ~8 s.
LONG_ENOUGH = ("duration=10s",)
JUDGED = ("before", "during", "after")  # `between` and `grace` samples are recorded, not judged


def failing(summary: dict, judged_only: bool = False) -> dict[str, set[str]]:
    """The phases in which each probe had a sample that was not ok (judged_only: in the judged phases)."""
    out: dict[str, set[str]] = {}
    for s in summary["samples"]:
        if s["verdict"] != "ok" and (not judged_only or s["phase"] in JUDGED):
            out.setdefault(s["probe"], set()).add(s["phase"])
    return out


def test_truncated_stream_experiment_holds_and_counts_the_cuts(ref, tmp_path, state_dir, monkeypatch):
    monkeypatch.setenv("CHAOSKIT_REF_DIR", str(ref))
    port = free_port()
    code, summary, out = run_llm("truncated-stream", tmp_path, state_dir, port, *LONG_ENOUGH)
    assert code == 0, out  # held, as documented in the experiment's header
    assert summary["verdict"] == "held" and summary["rollback_complete"]
    fault = summary["faults"][0]
    cut = fault["observed_before_revert"]["faults"]["cut"]
    assert fault["type"] == "llm.proxy" and cut["applied"] > 0 and 0.15 <= cut["applied_share"] <= 0.35
    during = [s for s in summary["samples"] if s["probe"] == "streams-through-proxy" and s["phase"] == "during"]
    assert during and all(s["values"]["errors.stream_truncated"] > 0 for s in during)
    assert no_proxy_left(port)


def test_mid_stream_stall_experiment_holds_and_tells_stalls_from_timeouts(ref, tmp_path, state_dir, monkeypatch):
    monkeypatch.setenv("CHAOSKIT_REF_DIR", str(ref))
    port = free_port()
    code, summary, out = run_llm("mid-stream-stall", tmp_path, state_dir, port, *LONG_ENOUGH)
    assert code == 0, out  # held, as documented in the experiment's header
    assert summary["verdict"] == "held" and summary["rollback_complete"]
    stall = applied(summary, "stall")
    assert stall["applied"] > 0 and 0.18 <= stall["applied_share"] <= 0.42, stall
    during = {s["probe"]: s for s in summary["samples"] if s["phase"] == "during"}
    assert {"with-stall-timeout", "request-timeout-only"} <= set(during), summary["samples"]
    assert during["with-stall-timeout"]["values"]["errors.stream_stalled"] > 0
    assert during["request-timeout-only"]["values"]["errors.timeout"] > 0
    assert no_proxy_left(port)


def test_retry_storm_experiment_holds_with_retry_after_at_the_proxy_share(ref, tmp_path, state_dir, monkeypatch):
    monkeypatch.setenv("CHAOSKIT_REF_DIR", str(ref))
    port = free_port()
    code, summary, out = run_llm("retry-storm", tmp_path, state_dir, port, *LONG_ENOUGH)
    assert code == 0, out  # held, as documented in the experiment's header
    assert summary["verdict"] == "held" and summary["rollback_complete"]
    storm = applied(summary, "storm")
    assert storm["applied"] > 0 and 0.12 <= storm["applied_share"] <= 0.28, storm
    during = [s for s in summary["samples"] if s["probe"] == "sla-through-proxy" and s["phase"] == "during"]
    assert during and all(s["values"]["errors.unavailable_retry_after"] > 0 for s in during)
    assert no_proxy_left(port)


def test_token_delay_tpot_experiment_deviates_on_tpot_alone(ref, tmp_path, state_dir, monkeypatch):
    monkeypatch.setenv("CHAOSKIT_REF_DIR", str(ref))
    port = free_port()
    code, summary, out = run_llm("token-delay-tpot", tmp_path, state_dir, port, *LONG_ENOUGH)
    assert code == 1, out  # deviated, as documented in the experiment's header: the TPOT SLO catches the delay
    assert summary["verdict"] == "deviated" and summary["rollback_complete"]
    delay = applied(summary, "token_delay-0")
    assert delay["applied"] > 0, delay
    # only the TPOT clause through the proxy fails, in the method (grace included); nothing before or after
    assert failing(summary).keys() == {"tpot-through-proxy"} and "during" in failing(summary)["tpot-through-proxy"]
    during = [s for s in summary["samples"] if s["probe"] == "tpot-through-proxy" and s["phase"] == "during"]
    assert during and all(s["values"]["tpot_p50_ms"] >= 25 and s["values"]["ttft_p50_ms"] < 200 for s in during)
    assert no_proxy_left(port)


def test_silent_wrong_answers_experiment_deviates_on_the_correctness_probe_alone(ref, tmp_path, state_dir,
                                                                                 monkeypatch):
    monkeypatch.setenv("CHAOSKIT_REF_DIR", str(ref))
    port = free_port()
    code, summary, out = run_llm("silent-wrong-answers", tmp_path, state_dir, port, "duration=4s")
    assert code == 1, out  # deviated, as documented in the experiment's header
    assert summary["verdict"] == "deviated" and summary["rollback_complete"]
    # every request a 200 in time (the slo probe holds); only the answers' content fails, during the fault alone
    # (a sample that started before the revert and ended after it is `between`: recorded, not judged)
    assert failing(summary, judged_only=True) == {"answers-through-proxy": {"during"}}
    assert applied(summary, "garble")["applied"] > 0 and applied(summary, "clean-cut")["applied"] > 0
    during = [s["values"] for s in summary["samples"] if s["probe"] == "answers-through-proxy"
              and s["phase"] == "during"]
    assert sum(v["failures.mismatch"] for v in during) > 0 and sum(v["failures.truncated"] for v in during) > 0
    assert all(v["failures.error"] == v["failures.empty"] == 0 for v in during), during
    assert no_proxy_left(port)
