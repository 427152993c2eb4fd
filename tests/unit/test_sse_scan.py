"""Counting token events in SSE blocks: the one-regex fast path agrees with a per-event JSON parse."""

from __future__ import annotations

import json

import pytest

from chaoskit.load.clients import event_tokens, scan_sse


def block(*events: object) -> bytes:
    return b"".join(b"data: " + (e if isinstance(e, bytes) else json.dumps(e).encode()) + b"\n\n" for e in events)


CASES = {
    "openai": [{"choices": [{"text": "a", "index": 0, "logprobs": {"text_offset": [0]}}]},
               {"choices": [{"text": "", "index": 0}]},
               {"choices": [{"text": "\"q", "index": 0}, {"text": "b", "index": 1}]}],
    "openai-chat": [{"choices": [{"delta": {"role": "assistant", "content": ""}}]},
                    {"choices": [{"delta": {"reasoning_content": "x", "content": "hi"}}]},
                    {"choices": [{"delta": {"content": "!"}}]}],
    "triton": [{"text_output": "t"}, {"text_output": ""}, {"text_output": "u", "model_name": "tiny_lm"}],
}


@pytest.mark.parametrize("api", CASES)
def test_fast_count_matches_a_full_parse(api):
    events = CASES[api]
    assert scan_sse(api, block(*events, b"[DONE]")) == (sum(event_tokens(api, e) for e in events), None)


def test_usage_and_errors_take_the_careful_path():
    usage = {"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 7}}
    assert scan_sse("openai", block({"choices": [{"text": "a"}]}, usage, b"[DONE]")) == (1, 7)
    two = {"choices": [{"text": "a", "index": 0}, {"text": "b", "index": 1}]}  # one per choice, as the fast path
    assert scan_sse("openai", block(two, usage, b"[DONE]")) == (2, 7)
    with pytest.raises(ValueError, match="overloaded"):
        scan_sse("openai", block({"error": {"message": "overloaded"}}))
