"""llm.proxy's tool_args and schema_break rewriting (chaoskit.injectors.llm_proxy.answers) on streams shaped as
vLLM sends them and on whole answers: what a client assembling the stream gets for each mode, exactly, how often
each fault counts as applied, and what passes unchanged; error_event's chunk as vLLM words one."""

from __future__ import annotations

import json

import pytest

from chaoskit.injectors.llm_proxy.answers import Rewrite
from chaoskit.injectors.llm_proxy.faults import ErrorEventParams, FaultTable, Request
from chaoskit.injectors.llm_proxy.sse import ARGUMENTS, DONE, TOKEN, error_event

ARGS = '{"city": "Paris", "days": 3}'
FRAGMENTS = ['{"city', '": "Pa', 'ris", ', '"days"', ": 3}"]
SCHEMA = {"type": "object", "required": ["city", "days"],
          "properties": {"city": {"type": "string"}, "days": {"type": "integer"}}}
JSON_REQUEST = json.dumps({"messages": [], "response_format": {
    "type": "json_schema", "json_schema": {"name": "f", "schema": SCHEMA}}}).encode()


def event(delta: dict, finish: str | None = None) -> bytes:
    return b"data: " + json.dumps({"id": "chatcmpl-1", "object": "chat.completion.chunk", "model": "m",
                                   "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}).encode() + b"\n\n"


def tool_stream(fragments: list[str] = FRAGMENTS) -> list[bytes]:
    head = {"role": "assistant", "tool_calls": [{"index": 0, "id": "call-1", "type": "function",
                                                 "function": {"name": "get_weather", "arguments": ""}}]}
    frags = [{"tool_calls": [{"index": 0, "function": {"arguments": f}}]} for f in fragments]
    return [event(head), *(event(f) for f in frags), event({}, "tool_calls"), b"data: [DONE]\n\n"]


def text_stream(pieces: list[str]) -> list[bytes]:
    return ([event({"role": "assistant", "content": pieces[0]})] + [event({"content": p}) for p in pieces[1:-1]]
            + [event({"content": pieces[-1]}, "stop"), b"data: [DONE]\n\n"])


def fault(type_: str, **params) -> object:
    return FaultTable([{"name": type_, "type": type_, "params": params}], 0).faults[0]


def through(rw: Rewrite, events: list[bytes]) -> list[bytes]:
    return [out for ev in events for out in rw.event(ev)] + rw.flush()


def assemble(events: list[bytes]) -> tuple[dict[int, dict], str | None, str, bool]:
    """What a client accumulating the deltas has: tool calls by index, finish_reason, content, [DONE] seen."""
    calls: dict[int, dict] = {}
    finish, content, done = None, "", False
    for ev in events:
        assert ev.endswith(b"\n\n")
        if ev == b"data: [DONE]\n\n":
            done = True
            continue
        choice = json.loads(ev[6:])["choices"][0]
        finish = choice["finish_reason"] or finish
        content += choice["delta"].get("content") or ""
        for tc in choice["delta"].get("tool_calls") or ():
            c = calls.setdefault(tc["index"], {"id": "", "name": "", "arguments": ""})
            c["id"] += tc.get("id") or ""
            c["name"] += tc["function"].get("name") or ""
            c["arguments"] += tc["function"].get("arguments") or ""
    return calls, finish, content, done


@pytest.mark.parametrize("mode, name, arguments, finish, calls", [
    ("cut", "get_weather", '{"city": "Paris", "days": ', "tool_calls", 1),
    ("invalid_json", "get_weather", "{'city': 'Paris', 'days': 3}", "tool_calls", 1),
    ("bad_escape", "get_weather", '{"\\x41city": "Paris", "days": 3}', "tool_calls", 1),
    ("wrong_tool_name", "get_weather_unknown", ARGS, "tool_calls", 1),
    ("duplicate_call", "get_weather", ARGS, "tool_calls", 2),
    ("finish_stop", "get_weather", ARGS, "stop", 1),
])
def test_tool_args_on_a_stream_and_a_whole_answer(mode, name, arguments, finish, calls):
    f = fault("tool_args", mode=mode)
    got, fin, content, done = assemble(through(Rewrite(f, None, b"{}"), tool_stream()))
    assert (got[0]["id"], got[0]["name"], got[0]["arguments"], fin, len(got), content, done) == \
        ("call-1", name, arguments, finish, calls, "", True)
    if mode == "duplicate_call":
        assert got[1] == {"id": "call-1-2", "name": "get_weather", "arguments": ARGS}
    if mode in ("cut", "invalid_json", "bad_escape"):
        with pytest.raises(ValueError):
            json.loads(arguments)
    whole = {"id": "chatcmpl-1", "choices": [{"index": 0, "finish_reason": "tool_calls", "message": {
        "role": "assistant", "content": None, "tool_calls": [
            {"id": "call-1", "type": "function", "function": {"name": "get_weather", "arguments": ARGS}}]}}]}
    out = json.loads(Rewrite(f, None, b"{}").whole(json.dumps(whole).encode()))
    choice = out["choices"][0]
    tc = choice["message"]["tool_calls"]
    half = '{"city": "Pari'  # a whole answer's cut: the arguments' first half
    assert (tc[0]["function"]["name"], tc[0]["function"]["arguments"], choice["finish_reason"], len(tc)) == \
        (name, half if mode == "cut" else arguments, finish, calls)
    assert f.applied == 2  # once per answer, however many events it changed


def test_cut_with_the_arguments_in_one_fragment_and_no_final_event():
    f = fault("tool_args", mode="cut")
    events = tool_stream([ARGS])
    got, fin, _, done = assemble(through(Rewrite(f, None, b"{}"), events[:2] + events[3:]))  # no finish event
    assert (got[0]["arguments"], fin, done, f.applied) == ('{"city": "Pari', None, True, 1)


def test_tool_args_leave_a_text_answer_alone():
    events = text_stream([" the", " model"])
    for mode in ("cut", "invalid_json", "bad_escape", "wrong_tool_name", "duplicate_call", "finish_stop"):
        f = fault("tool_args", mode=mode)
        assert through(Rewrite(f, None, b"{}"), events) == events and f.applied == 0
    whole = json.dumps({"choices": [{"message": {"role": "assistant", "content": "hi"}, "finish_reason": "stop"}]})
    assert Rewrite(fault("tool_args", mode="cut"), None, b"{}").whole(whole.encode()) == whole.encode()


@pytest.mark.parametrize("mode, answer", [("drop_required", {"days": 3}), ("wrong_type", {"city": 5, "days": 3})])
def test_schema_break_streamed_and_whole(mode, answer):
    f = fault("schema_break", mode=mode)
    out = through(Rewrite(None, f, JSON_REQUEST), text_stream(FRAGMENTS))
    _, fin, content, done = assemble(out)
    assert (json.loads(content), fin, done, len(out)) == (answer, "stop", True, 3)  # one content delta, final, DONE
    whole = {"choices": [{"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": ARGS}}]}
    out_whole = json.loads(Rewrite(None, f, JSON_REQUEST).whole(json.dumps(whole).encode()))
    assert json.loads(out_whole["choices"][0]["message"]["content"]) == answer and f.applied == 2


def test_schema_break_needs_a_json_schema_request_and_a_json_answer():
    f = fault("schema_break", mode="drop_required")
    events = text_stream(FRAGMENTS)
    assert through(Rewrite(None, f, b'{"messages": []}'), events) == events
    not_json = through(Rewrite(None, f, JSON_REQUEST), text_stream([" the", " model"]))
    assert assemble(not_json)[1:] == ("stop", " the model", True) and f.applied == 0
    lax = json.dumps({"response_format": {"type": "json_schema", "json_schema": {"schema": {"type": "object"}}}})
    assert assemble(through(Rewrite(None, f, lax.encode()), events))[2] == ARGS and f.applied == 0  # none required


def test_error_event_chunks_and_what_counts_toward_after_tokens():
    params = ErrorEventParams(message="pop from empty list", error_type="InternalServerError", code=500)
    assert json.loads(error_event("/v1/chat/completions", params)) == {"error": {
        "message": "pop from empty list", "type": "InternalServerError", "param": None, "code": 500}}
    assert json.loads(error_event("/v2/models/m/generate_stream", params)) == {"error": "pop from empty list"}
    frag = tool_stream()[1]
    assert ARGUMENTS.search(frag) and not TOKEN.search(frag) and not ARGUMENTS.search(tool_stream()[0])
    assert DONE.search(b"data: [DONE]\n\n") and DONE.search(b"data:[DONE]\r\n\r\n") and not DONE.search(frag)


def test_the_plan_takes_the_new_faults_and_reads_whole_answers_only_for_rewrites():
    wire = [{"name": n, "type": n, "params": p} for n, p in (("tool_args", {"mode": "cut"}), ("error_event", {
        "after_tokens": 0, "done": True, "message": "m", "error_type": "t", "code": 500}),
        ("schema_break", {"mode": "wrong_type"}))]
    t = FaultTable(wire, 0)
    req = Request(b"POST", "/v1/chat/completions", b"POST / HTTP/1.1\r\n\r\n", b"{}", "127.0.0.1")
    plan = t.plan(req)
    assert plan is not None and plan.on_events() and plan.rewrites()
    assert (plan.tool_args.name, plan.error_event.name, plan.schema_break.name) == \
        ("tool_args", "error_event", "schema_break")
    only_error = FaultTable(wire[1:2], 0).plan(req)
    assert only_error is not None and only_error.on_events() and not only_error.rewrites()


def test_a_whole_answer_is_read_to_its_end_in_each_framing():
    from chaoskit.injectors.llm_proxy.server import Whole
    from chaoskit.injectors.llm_proxy.sse import length_line

    body = json.dumps({"choices": [{"message": {"content": ARGS}}]}).encode()
    w = Whole(b"", "length", len(body))
    assert [w.feed(body[:10]), w.feed(body[10:])] == [False, True] and w.body() == body
    chunked = b"%x\r\n%b\r\n%x\r\n%b\r\n0\r\n\r\n" % (7, body[:7], len(body) - 7, body[7:])
    w = Whole(b"", "chunked", 0)
    assert [w.feed(chunked[i:i + 5]) for i in range(0, len(chunked), 5)][-1] and w.body() == body
    w = Whole(b"", "close", 0)
    assert not w.feed(body) and w.body() == body  # its end: the upstream's close
    head = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
    assert length_line(head, 42) == b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 42\r\n\r\n"


class Down:
    """The client side of an Exchange: what it was sent, and how the exchange ended."""

    def __init__(self):
        self.t, self.sent, self.ended = self, [], None
        self.closed, self.ex = False, None

    def write(self, data: bytes) -> None:
        self.sent.append(data)

    def done(self, close: bool, drop_upstream: bool) -> None:
        self.ended = close


@pytest.mark.parametrize("limit", [10**6, 100])
@pytest.mark.parametrize("framing", ["length", "chunked"])
def test_a_whole_answer_over_the_body_limit_is_relayed_unchanged_and_not_counted(monkeypatch, limit, framing):
    from chaoskit.injectors.llm_proxy import server

    monkeypatch.setattr(server, "MAX_BODY", limit)
    table = FaultTable([{"name": "tool_args", "type": "tool_args", "params": {"mode": "finish_stop"}}], 0)
    req = Request(b"POST", "/v1/chat/completions", b"POST / HTTP/1.1\r\n\r\n", b"{}", "127.0.0.1")
    body = json.dumps({"choices": [{"index": 0, "finish_reason": "tool_calls", "message": {
        "role": "assistant", "tool_calls": [{"id": "c1", "type": "function", "function": {
            "name": "get_weather", "arguments": ARGS}}]}}]}).encode()
    assert 100 < len(body) < 10**6
    framed, how = ((body, b"Content-Length: %d" % len(body)) if framing == "length" else
                   (b"%x\r\n%b\r\n%x\r\n%b\r\n0\r\n\r\n" % (60, body[:60], len(body) - 60, body[60:]),
                    b"Transfer-Encoding: chunked"))
    head = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n%b\r\n\r\n" % how
    down = Down()
    ex = server.Exchange(down, req, b"", True, table.plan(req))  # type: ignore[arg-type]
    down.ex = ex
    for i in range(0, len(head + framed), 40):  # as the upstream's segments come
        ex.feed((head + framed)[i:i + 40])
    sent = b"".join(down.sent)
    assert down.ended is False  # the answer ended where its framing says, the connection kept
    if limit == 100:  # held back up to 100 bytes, then everything relayed as it came
        assert sent == head[:-2] + b"X-Chaoskit-Fault: tool_args\r\n\r\n" + framed
        assert table.faults[0].applied == 0
    else:
        assert b'"finish_reason": "stop"' in sent and table.faults[0].applied == 1
