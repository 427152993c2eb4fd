"""The correctness probe through llm.proxy in front of an OpenAI stand-in: what the official OpenAI SDK makes of
the two truncations (a cut raises APIConnectionError; a clean end without finish_reason or [DONE] is taken
silently as a whole answer) and that the probe counts both, corrupted tokens and errors by kind. On the reference
Triton (1% corrupt_tokens caught in one sample, healthy 3 of 3): tests/integration/test_llm_proxy.py."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path

import pytest

from chaoskit.injectors.llm_proxy.fault import LlmProxy
from chaoskit.probes.correctness import CorrectnessProbe, CorrectnessProbeSpec
from tests.conftest import free_port

MODEL = "m"
PROMPTS = ["The capital of France is", "chaos engineering"]


def start_proxy(upstream: str, faults: list[dict], seed: int = 0) -> tuple[str, dict]:
    """An llm.proxy in front of `upstream`: (its base URL, its record)."""
    port = free_port()
    inj = LlmProxy(LlmProxy.Spec(type="llm.proxy", listen=f"127.0.0.1:{port}", upstream=upstream, faults=faults,
                                 seed=seed))
    inj.ctx.lifetime_s = 300
    inj.preflight()
    return f"http://127.0.0.1:{port}", inj.apply(inj.prepare())


def stop_proxy(rec: dict) -> None:
    LlmProxy.revert(rec)
    assert not LlmProxy.observe(rec)


def probe(url: str, **kw) -> CorrectnessProbe:
    return CorrectnessProbe(CorrectnessProbeSpec.model_validate({"type": "correctness", "name": "answers",
                                                                  "url": url, **kw}))


async def samples(p: CorrectnessProbe, n: int = 2) -> list[dict]:
    """The first sample records (from record_url when given), the others are judged against it."""
    try:
        return [await p.measure() for _ in range(n)]
    finally:
        await p.close()


@pytest.fixture(scope="module")
def standin():
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "tests.helpers.openai_standin", str(port), MODEL],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                            cwd=Path(__file__).resolve().parents[2])  # (its aiohttp logs each cut as a traceback)
    try:
        assert proc.stdout and proc.stdout.readline().strip() == "ready"
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.kill()
        proc.wait()


@pytest.fixture(scope="module")
def openai_proxy(standin):
    """A proxy in front of the OpenAI stand-in, each fault chosen by the request header X-Fault."""
    faults = {"cut": {"type": "truncate", "after_tokens": 3},
              "clean": {"type": "truncate", "after_tokens": 3, "clean": True},
              "garble": {"type": "corrupt_tokens", "token_share": 1.0},
              "down": {"type": "abort", "status": 503}}
    url, rec = start_proxy(standin, [{"name": k, **f, "match": {"headers": {"X-Fault": k}}} for k, f in faults.items()])
    yield url
    stop_proxy(rec)


def test_the_openai_sdk_raises_on_a_cut_stream_but_takes_a_clean_truncation_as_whole(standin, openai_proxy):
    from openai import APIConnectionError, OpenAI

    def stream(base: str, fault: str | None = None) -> list:
        client = OpenAI(base_url=f"{base}/v1", api_key="none", max_retries=0,
                        default_headers={"X-Fault": fault} if fault else None)
        return list(client.completions.create(model=MODEL, prompt="hello", max_tokens=8, temperature=0, stream=True))

    whole = stream(standin)
    assert [c.choices[0].text for c in whole] == [f"t{i}" for i in range(8)]
    assert whole[-1].choices[0].finish_reason == "length"
    with pytest.raises(APIConnectionError):  # today's truncate: the connection closed mid-body
        stream(openai_proxy, "cut")
    clean = stream(openai_proxy, "clean")  # no exception, no warning: to the SDK this stream is complete
    assert [c.choices[0].text for c in clean] == ["t0", "t1", "t2"]
    assert [c.choices[0].finish_reason for c in clean] == [None, None, None]  # nothing says why it ended


@pytest.mark.parametrize("fault, stream, kind, failed", [
    ("cut", True, "truncated", 8), ("clean", True, "truncated", 8), ("garble", True, "mismatch", 8),
    ("garble", "both", "mismatch", 4),  # corrupt_tokens rewrites SSE streams: the JSON answers pass unchanged
    ("down", True, "error", 8), ("none", "both", None, 0)])
def test_the_probe_counts_each_failed_answer_by_kind(standin, openai_proxy, fault, stream, kind, failed):
    recorded, judged = asyncio.run(samples(probe(openai_proxy, record_url=standin, model=MODEL, prompts=PROMPTS,
                                                 requests=8, max_tokens=8, stream=stream,
                                                 headers={"X-Fault": fault})))
    assert recorded["failed"] == 0 and recorded["recorded"] == 2
    assert judged["failed"] == failed and (kind is None or judged[f"failures.{kind}"] == failed), judged
