"""batching_fallback_fragmentation: a batch arriving at a fragmented KV pool runs as static sub-batches that fit,
instead of being admitted at once (dynamic batching) and failing in part with KVCacheOOM. On TinyLM directly,
and through the Triton python-backend model with a stand-in for triton_python_backend_utils."""

from __future__ import annotations

import json
import sys
import types

import numpy as np
import pytest

from chaoskit.reference.tinylm import KVCacheOOM, TinyLM, parse_fallback

BLOCK_BYTES = 4 * 2 * 16 * 64 * 4  # layers x (K, V) x block_tokens x dim x float32: 32 KiB
POOL_BLOCKS = 64  # 1024 token positions
RESIDUE = (150, 200, 250)  # prompts (+2 new tokens) of 10, 13 and 16 blocks, growing so none reuses another
BATCH = [(b"q" * 100, 2)] * 8  # 8 requests of 7 blocks: 56 blocks, more than the 25 left free by the residue


def model(fallback: str | None = None, eviction: str = "none") -> TinyLM:
    return TinyLM(budget_bytes=POOL_BLOCKS * BLOCK_BYTES, isolate=False, eviction=eviction, residue_ttl_s=600,
                  batching_fallback_fragmentation=fallback)


def fragment(lm: TinyLM, sizes: tuple[int, ...] = RESIDUE) -> float:
    """Requests one at a time that leave their blocks as residue (isolate_kv_cache false); the fragmentation."""
    for n in sizes:
        assert isinstance(lm.generate([(b"r" * n, 2)])[0], bytes)
    assert lm.fallbacks == 0  # a batch of one is never split
    return lm.pool.fragmentation()


def ooms(results: list) -> int:
    return sum(isinstance(r, KVCacheOOM) for r in results)


@pytest.mark.parametrize("eviction", ["none", "lru"])
def test_fragmented_pool_and_a_big_batch_fail_without_fallback(eviction):
    lm = model(None, eviction)
    assert lm.pool.n == POOL_BLOCKS and fragment(lm) > 0.45
    results = lm.generate(BATCH)
    assert lm.last_path == "dynamic" and lm.fallbacks == 0
    # the three residues are reused, three more fit in the 25 free blocks, the rest fail (lru has nothing left
    # to evict: the residue is live again)
    assert ooms(results) == 2 and lm.pool.ooms == 2
    assert all(isinstance(r, bytes) and len(r) == 2 for r in results if not isinstance(r, KVCacheOOM))


def test_fallback_runs_static_sub_batches_and_every_request_succeeds():
    lm = model("0.45", "lru")
    assert fragment(lm) > 0.45
    results = lm.generate(BATCH)
    assert ooms(results) == 0 and lm.pool.ooms == 0
    assert all(isinstance(r, bytes) and len(r) == 2 for r in results)
    assert lm.last_path == "static" and lm.last_groups == 2 and lm.fallbacks == 1
    lm.generate(BATCH)  # residue everywhere again: falls back again
    assert lm.fallbacks == 2


def test_fallback_with_eviction_none_reuses_the_first_sub_batch_residue():
    """Without eviction nothing is reclaimed: the second sub-batch fits only in the residue the first left."""
    lm = model("0.45", "none")
    fragment(lm)
    results = lm.generate(BATCH)
    assert lm.last_path == "static" and lm.last_groups == 2 and lm.fallbacks == 1
    assert ooms(results) == 0


def test_fragmentation_below_threshold_admits_the_batch_at_once():
    lm = model("0.45", "lru")
    frag = fragment(lm, (150,))  # one residue of 10 blocks at the bottom: the rest is one free run
    assert 0 < frag < 0.45
    admitted = []
    for group in lm.admit(BATCH[:4]):
        admitted.append(len(group))
        for _, s in group:
            lm.finish(s)
    assert admitted == [4] and lm.last_path == "dynamic" and lm.last_groups == 1 and lm.fallbacks == 0


def test_fallback_off_by_default_and_parsed():
    assert model().fallback_fragmentation is None
    for off in (None, "", "none", "None", " off "):
        assert parse_fallback(off) is None
    assert parse_fallback("0.45") == 0.45
    for bad in ("1.5", "-0.1", "lots"):
        with pytest.raises(ValueError):
            parse_fallback(bad)


# ---------------------------------------------------------------- the Triton model (python backend) --------


class _Metric:
    def __init__(self) -> None:
        self.value = 0.0

    def set(self, v: float) -> None:
        self.value = v

    def increment(self, v: float) -> None:
        self.value += v


class _Family:
    GAUGE, COUNTER = "gauge", "counter"
    made: dict[str, _Metric] = {}

    def __init__(self, name: str, doc: str, kind: str) -> None:
        self.name = name

    def Metric(self, labels: dict) -> _Metric:  # noqa: N802 (the backend's API)
        return _Family.made.setdefault(self.name, _Metric())


class _Tensor:
    def __init__(self, name: str, value: np.ndarray) -> None:
        self.name, self.value = name, value

    def as_numpy(self) -> np.ndarray:
        return self.value


class _Response:
    def __init__(self, output_tensors: list | None = None, error: str | None = None) -> None:
        self.text = b"".join(t.value.reshape(-1)[0] for t in output_tensors or [])
        self.error = error


class _Sender:
    def __init__(self) -> None:
        self.sent: list[tuple[_Response | None, int]] = []

    def send(self, response: _Response | None = None, flags: int = 0) -> None:
        self.sent.append((response, flags))


class _Request:
    def __init__(self, text: bytes, max_tokens: int) -> None:
        self.inputs = {"text_input": _Tensor("text_input", np.array([[text]], dtype=np.object_)),
                       "max_tokens": _Tensor("max_tokens", np.array([[max_tokens]], dtype=np.int32))}
        self.sender = _Sender()

    def get_response_sender(self) -> _Sender:
        return self.sender


def _pb_utils() -> types.ModuleType:
    pb = types.ModuleType("triton_python_backend_utils")
    pb.MetricFamily = _Family
    pb.Tensor = _Tensor
    pb.InferenceResponse = _Response
    pb.TritonError = str
    pb.TRITONSERVER_RESPONSE_COMPLETE_FINAL = 1
    pb.get_input_tensor_by_name = lambda request, name: request.inputs.get(name)
    pb.using_decoupled_model_transaction_policy = lambda cfg: cfg.get("model_transaction_policy", {}).get(
        "decoupled", False)
    return pb


@pytest.fixture
def triton_model(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "triton_python_backend_utils", _pb_utils())
    monkeypatch.delitem(sys.modules, "chaoskit.reference.triton_model", raising=False)
    from chaoskit.reference import triton_model as tm

    def make(decoupled: bool, **params: str):
        _Family.made = {}
        params = {"memory_budget": str(POOL_BLOCKS * BLOCK_BYTES), "isolate_kv_cache": "false",
                  "residue_ttl_s": "600", **params}
        cfg = {"parameters": {k: {"string_value": v} for k, v in params.items()},
               "model_transaction_policy": {"decoupled": decoupled}}
        m = tm.TritonPythonModel()
        m.initialize({"model_config": json.dumps(cfg), "model_repository": str(tmp_path), "model_version": "1",
                      "model_name": "tiny_lm"})
        return m, _Family.made

    yield make
    sys.modules.pop("chaoskit.reference.triton_model", None)  # it is bound to the stand-in module
    import chaoskit.reference

    vars(chaoskit.reference).pop("triton_model", None)


def _fragment_model(m) -> None:
    for n in RESIDUE:
        r = _Request(b"r" * n, 2)
        out = m.execute([r])
        if out is not None:
            assert out[0].error is None
        else:
            assert all(resp is None or resp.error is None for resp, _ in r.sender.sent)


@pytest.mark.parametrize("decoupled", [False, True])
def test_triton_model_fallback_and_its_counter(triton_model, decoupled):
    for fallback, eviction, failures, fallbacks in (("none", "none", 2, 0), ("0.45", "lru", 0, 1)):
        m, metrics = triton_model(decoupled, cache_eviction_policy=eviction,
                                  batching_fallback_fragmentation=fallback)
        _fragment_model(m)
        assert metrics["tiny_lm_kv_fragmentation_ratio"].value > 0.45
        requests = [_Request(p, n) for p, n in BATCH]
        out = m.execute(requests)
        if decoupled:
            assert out is None
            for r in requests:  # each stream ends with one final flag: after an error, or after its tokens
                assert [f for _, f in r.sender.sent].count(1) == 1 and r.sender.sent[-1][1] == 1
            errors = [r for r in requests if any(resp is not None and resp.error for resp, _ in r.sender.sent)]
            assert all(len([x for x, _ in r.sender.sent if x is not None]) == 2
                       for r in requests if r not in errors)
        else:
            errors = [r for r in out if r.error]
            assert all(len(r.text.decode()) == 2 for r in out if not r.error)  # latin-1 text as UTF-8
        assert len(errors) == failures
        assert metrics["tiny_lm_kv_oom_total"].value == failures
        assert metrics["tiny_lm_batching_fallback_total"].value == fallbacks
        m.finalize()
