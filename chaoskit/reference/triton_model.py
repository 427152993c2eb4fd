"""tiny_lm on Triton's python backend: batched requests in, generated text out (or one response per token
when the model is decoupled), KV-pool metrics through the backend's metrics API. With `crash_pattern` set, a
request whose prompt contains it kills the replica (the tritonserver process and so its stubs): a poison
request, as the 2026 engine advisories describe."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path
from typing import Any

import numpy as np
import triton_python_backend_utils as pb_utils  # provided by the python backend stub

from chaoskit.reference.tinylm import WEIGHTS_FILE, KVCacheOOM, Seq, TinyLM, load_weights
from chaoskit.units import parse_size

DEFAULT_MAX_TOKENS, MAX_TOKENS = 16, 512


def _params(cfg: dict[str, Any]) -> dict[str, str]:
    return {k: v.get("string_value", "") for k, v in cfg.get("parameters", {}).items()}


class TritonPythonModel:
    def initialize(self, args: dict[str, str]) -> None:
        cfg = json.loads(args["model_config"])
        p = _params(cfg)
        self.decoupled = pb_utils.using_decoupled_model_transaction_policy(cfg)
        weights_file = Path(args["model_repository"]) / args["model_version"] / WEIGHTS_FILE
        t0 = time.monotonic()
        weights = load_weights(weights_file) if weights_file.exists() else None
        self.load_s = time.monotonic() - t0
        self.lm = TinyLM(weights, budget_bytes=parse_size(p.get("memory_budget", "128MiB")),
                         block_tokens=int(p.get("block_tokens", "16")),
                         isolate=p.get("isolate_kv_cache", "true").lower() == "true",
                         eviction=p.get("cache_eviction_policy", "lru"),
                         residue_ttl_s=float(p.get("residue_ttl_s", "5")),
                         batching_fallback_fragmentation=p.get("batching_fallback_fragmentation", ""))
        crash = p.get("crash_pattern", "none")
        self.crash = crash.encode() if crash and crash != "none" else None
        labels = {"model": args["model_name"], "version": args["model_version"]}
        gauge, counter = pb_utils.MetricFamily.GAUGE, pb_utils.MetricFamily.COUNTER
        self.families: list[Any] = []  # a MetricFamily must outlive its Metrics

        def fam(name: str, doc: str, kind: Any) -> Any:
            self.families.append(pb_utils.MetricFamily(name, doc, kind))
            return self.families[-1]

        self.m_usage = fam("tiny_lm_kv_pool_usage_ratio", "share of KV pool blocks not free", gauge).Metric(labels)
        self.m_frag = fam("tiny_lm_kv_fragmentation_ratio", "share of the non-live KV pool that is not one free run",
                          gauge).Metric(labels)
        self.m_resid = fam("tiny_lm_kv_residency_seconds", "mean age of resident KV blocks", gauge).Metric(labels)
        self.m_bytes = fam("tiny_lm_kv_pool_bytes", "size of the KV pool", gauge).Metric(labels)
        self.m_oom = fam("tiny_lm_kv_oom_total", "requests failed because the KV pool was exhausted",
                         counter).Metric(labels)
        self.m_fallback = fam("tiny_lm_batching_fallback_total",
                              "batches run as static sub-batches because KV fragmentation was over "
                              "batching_fallback_fragmentation", counter).Metric(labels)
        self.m_bytes.set(self.lm.pool.nbytes)
        fam("tiny_lm_weights_load_seconds", "time to read the weights at the last load", gauge).Metric(labels).set(
            self.load_s)
        self.ooms_seen = self.fallbacks_seen = 0

    def _inputs(self, request: Any) -> tuple[bytes, int]:
        text = pb_utils.get_input_tensor_by_name(request, "text_input").as_numpy().reshape(-1)[0]
        mt = pb_utils.get_input_tensor_by_name(request, "max_tokens")
        n = int(mt.as_numpy().reshape(-1)[0]) if mt is not None else DEFAULT_MAX_TOKENS
        return (text if isinstance(text, bytes) else str(text).encode()), max(1, min(MAX_TOKENS, n))

    @staticmethod
    def _text(tokens: bytes) -> Any:
        out = pb_utils.Tensor("text_output", np.array([[tokens.decode("latin-1").encode()]], dtype=np.object_))
        return pb_utils.InferenceResponse(output_tensors=[out])

    @staticmethod
    def _error(msg: str) -> Any:
        return pb_utils.InferenceResponse(error=pb_utils.TritonError(msg))

    def _metrics(self) -> None:
        pool = self.lm.pool
        self.m_usage.set(pool.usage())
        self.m_frag.set(pool.fragmentation())
        self.m_resid.set(pool.mean_residency_s())
        if pool.ooms > self.ooms_seen:
            self.m_oom.increment(pool.ooms - self.ooms_seen)
            self.ooms_seen = pool.ooms
        if self.lm.fallbacks > self.fallbacks_seen:
            self.m_fallback.increment(self.lm.fallbacks - self.fallbacks_seen)
            self.fallbacks_seen = self.lm.fallbacks

    def _crash_on_poison(self, inputs: list[Any]) -> None:
        """A prompt with crash_pattern kills the replica: its tritonserver (the stub's parent), then the stub."""
        if self.crash is not None and any(not isinstance(x, Exception) and self.crash in x[0] for x in inputs):
            os.kill(os.getppid(), signal.SIGKILL)
            os._exit(1)

    def execute(self, requests: list[Any]) -> list[Any] | None:
        inputs = []
        for r in requests:
            try:
                inputs.append(self._inputs(r))
            except Exception as e:  # a malformed request fails alone
                inputs.append(e)
        self._crash_on_poison(inputs)
        if self.decoupled:
            self._stream(requests, inputs)
            self._metrics()
            return None
        good = [(i, x) for i, x in enumerate(inputs) if not isinstance(x, Exception)]
        outs = dict(zip((i for i, _ in good), self.lm.generate([x for _, x in good]), strict=True))
        self._metrics()
        responses = []
        for i, x in enumerate(inputs):
            if isinstance(x, Exception):
                responses.append(self._error(f"bad request: {x}"))
            elif isinstance(outs[i], KVCacheOOM):
                responses.append(self._error(str(outs[i])))
            else:
                responses.append(self._text(outs[i]))
        return responses

    def _stream(self, requests: list[Any], inputs: list[Any]) -> None:
        """One response per generated token, then the final flag (admission as in TinyLM.generate)."""
        final = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
        senders = [r.get_response_sender() for r in requests]
        good = []
        for sender, x in zip(senders, inputs, strict=True):
            if isinstance(x, Exception):
                sender.send(self._error(f"bad request: {x}"), flags=final)
            else:
                good.append((sender, x))
        for group in self.lm.admit([x for _, x in good]):
            live: list[tuple[Any, Seq]] = []
            for i, seq in group:
                sender = good[i][0]
                if isinstance(seq, KVCacheOOM):
                    sender.send(self._error(str(seq)), flags=final)
                    continue
                self.lm.prefill(seq)
                live.append((sender, seq))
            while live:
                self.lm.step([s for _, s in live])
                still = []
                for sender, seq in live:
                    sender.send(self._text(bytes([seq.out[-1] % 256])))
                    if len(seq.out) >= seq.max_new:
                        sender.send(flags=final)
                        self.lm.finish(seq)
                    else:
                        still.append((sender, seq))
                live = still

    def finalize(self) -> None:
        self.m_usage = self.m_frag = self.m_resid = self.m_bytes = self.m_oom = self.m_fallback = None
        self.families.clear()
