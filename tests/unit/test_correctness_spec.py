"""correctness probe: its spec's refusals, how an answer is classified, what a stream's events say, prompts files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from pydantic import ValidationError

from chaoskit.errors import PreflightError
from chaoskit.experiment.schema import experiment_schema
from chaoskit.probes.correctness import (
    Answer,
    CorrectnessProbe,
    CorrectnessProbeSpec,
    _event_line,
    _Reader,
    classify,
    read_prompts,
)


def spec(**kw) -> CorrectnessProbeSpec:
    return CorrectnessProbeSpec.model_validate({"type": "correctness", "name": "answers", "url": "http://h:1",
                                                "model": "m", "prompts": ["hi"], **kw})


@pytest.mark.parametrize("kw, message", [
    ({"prompts": []}, "no prompts: give prompts, prompts_file or both"),
    ({"model": None}, "api openai needs model"),
    ({"api": "openai-chat", "model": None}, "api openai-chat needs model"),
    ({"phases": ["during"]}, "prompts without an answer are recorded in the before phase"),
    ({"expect": {"failures": {"mismtach": "== 0"}}}, "expect.failures.mismtach: unknown kind (did you mean "
                                                     "'mismatch'?)"),
    ({"expect": {"errors": "== 0"}}, "unknown key 'errors'"),
    ({"stream": "sometimes"}, "Input should be 'both'"),
    ({"requests": 0}, "greater than or equal to 1"),
    ({"url": "h:1"}, "should match pattern"),
    ({"prompts": [{"prompt": "hi", "answr": "x"}]}, "Extra inputs are not permitted"),
])
def test_invalid_specs(kw, message):
    with pytest.raises(ValidationError) as e:
        spec(**kw)
    assert message in str(e.value)


def test_golden_answers_need_no_before_phase_and_the_timeout_follows_the_rounds():
    s = spec(prompts=[{"prompt": "hi", "answer": "there"}], phases=["during"], api="triton", model=None,
             expect={"failed": "== 0", "failure_share": {"truncated": "< 0.1"}})
    assert s.timeout == 10.0 * 7 + 5.0  # 50 requests, 8 at a time: 7 rounds of request_timeout
    assert spec(requests=4, concurrency=4, request_timeout="2s").timeout == 7.0


@pytest.mark.parametrize("answer, expected, kind", [
    (Answer("Paris", True), "Paris", None),
    (Answer("Paris", True), None, None),  # not recorded yet
    (Answer("Lyon", True), "Paris", "mismatch"),
    (Answer("Par", True), "Paris", "truncated"),  # whole to the client, but a strict prefix of the answer
    (Answer("Paris", False), "Paris", "truncated"),  # no finish_reason / [DONE]
    (Answer("Paris", False), None, "truncated"),
    (Answer("", True), "Paris", "empty"),
    (Answer("", True), None, "empty"),
    (Answer("", False, "HTTP 503"), "Paris", "error"),
    (Answer(" a b a b c d", True), " a b c d", "restarted"),  # a failover that started the stream again
    (Answer(" a b c d", True), " a b c d", None),
    (Answer(" a b c c d", True), " a b c d", "duplicated"),
    (Answer(" a b b c d", True), " a b c d", "duplicated"),
    (Answer(" a d", True), " a b c d", "gap"),
    (Answer(" a b c", True), " a b c d", "truncated"),  # a prefix, even ended cleanly
    (Answer(" x b c d", True), " a b c d", "mismatch"),
    (Answer(" a b x d e", True), " a b c d", "mismatch"),
])
def test_classify(answer, expected, kind):
    assert classify(answer, expected) == kind


def events(api: str, lines: list[str], max_tokens: int = 4) -> Answer:
    r = _Reader(api, max_tokens)
    for line in lines:
        _event_line(r, line.encode() + b"\n")
    return r.answer(stream=True)


def test_what_a_stream_s_events_say():
    chunk = 'data: {"choices":[{"text":"%s","finish_reason":%s}]}'
    whole = [chunk % ("Pa", "null"), chunk % ("ris", '"length"'), "", "data: [DONE]"]
    assert events("openai", whole) == Answer("Paris", True)
    assert events("openai", whole[:2]) == Answer("Paris", False)  # no [DONE]
    assert events("openai", [chunk % ("Pa", "null"), "data: [DONE]"]) == Answer("Pa", False)  # no finish_reason
    usage = 'data: {"choices":[],"usage":{"completion_tokens":2}}'
    assert events("openai", [*whole[:2], usage, "data: [DONE]"]) == Answer("Paris", False)  # length, 2 of 4
    assert events("openai", [*whole[:2], usage, "data: [DONE]"], max_tokens=2) == Answer("Paris", True)
    chat = 'data: {"choices":[{"delta":{"content":"%s"},"finish_reason":%s}]}'
    assert events("openai-chat", [chat % ("Hi", "null"), chat % ("!", '"stop"'), "data: [DONE]"]) == Answer("Hi!", True)
    assert events("triton", ['data: {"text_output":"a"}', 'data: {"text_output":"b"}']) == Answer("ab", True)
    assert events("openai", ['data: {"error":{"message":"boom"}}']).error == 'error object: {"message": "boom"}'
    assert events("openai", ["data: {bad"]).error == "malformed event: b'{bad'"


def test_a_whole_json_answer():
    r = _Reader("openai-chat", 4)
    r.take({"choices": [{"message": {"content": "Hi"}, "finish_reason": "stop"}]}, stream=False)
    assert r.answer(stream=False) == Answer("Hi", True)


def test_prompts_file_plain_lines_and_json_lines(tmp_path: Path):
    f = tmp_path / "prompts.jsonl"
    f.write_text("plain prompt\n\n" + json.dumps({"prompt": "q", "answer": "a"}) + "\n")
    assert [(p.prompt, p.answer) for p in read_prompts(str(f))] == [("plain prompt", None), ("q", "a")]
    f.write_text('{"prompt": "q", "anser": "a"}\n')
    with pytest.raises(PreflightError, match="line 1: anser: Extra inputs are not permitted"):
        read_prompts(str(f))
    with pytest.raises(PreflightError, match="No such file"):
        read_prompts(str(tmp_path / "none"))


def test_preflight_refuses_a_prompts_file_without_answers_and_no_before_phase(tmp_path: Path):
    f = tmp_path / "p.txt"
    f.write_text("one\n")
    p = CorrectnessProbe(spec(prompts=[], prompts_file=str(f), phases=["during", "after"]))
    with pytest.raises(PreflightError, match="1 prompt\\(s\\) without an answer"):
        p.preflight()
    CorrectnessProbe(spec(prompts=[], prompts_file=str(f))).preflight()


def test_every_field_of_the_published_schema_has_a_description():
    defs = experiment_schema()["$defs"]
    for name in ("CorrectnessProbeSpec", "GoldenPrompt"):
        missing = [k for k, v in defs[name]["properties"].items() if k != "type" and not v.get("description")]
        assert not missing, f"{name}: fields without a description: {missing}"


def test_a_schema_asks_for_structured_answers_and_judges_them():
    from chaoskit.probes.correctness import request_for

    schema = {"type": "object", "required": ["city", "days"],
              "properties": {"city": {"type": "string"}, "days": {"type": "integer"}}}
    with pytest.raises(ValidationError, match="schema: structured answers need api openai-chat"):
        spec(schema=schema)
    s = spec(api="openai-chat", schema=schema)
    url, body = request_for(s, "http://h:1", "hi", True)
    assert body["response_format"] == {"type": "json_schema", "json_schema": {"name": "answer", "schema": schema}}
    assert "response_format" not in request_for(spec(api="openai-chat"), "http://h:1", "hi", True)[1]
    ok = '{"city": "Paris", "days": 3}'
    assert classify(Answer(ok, True), None, schema) is None
    assert classify(Answer(ok, True), ok, schema) is None
    assert classify(Answer('{"city": "Paris"}', True), None, schema) == "schema"  # what schema_break drop_required sends
    assert classify(Answer('{"city": 5, "days": 3}', True), None, schema) == "schema"  # ... and wrong_type
    assert classify(Answer('{"city": "Paris", "days": 3', True), None, schema) == "schema"
    assert classify(Answer('{"city": "Paris", "days": 3', False), None, schema) == "truncated"
