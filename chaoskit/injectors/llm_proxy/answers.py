"""llm.proxy's tool_args and schema_break: an OpenAI chat answer's tool calls and structured (json_schema)
content broken, on a streamed answer event by event (Rewrite.event, Rewrite.flush at its end) or on a whole one
(Rewrite.whole). What each mode does:

tool_args: cut: the arguments lose the second half of their last fragment (at least their closing brace; a whole
answer's arguments their second half); invalid_json: every double quote of the arguments becomes a single quote
(`{'city': 'Paris'}`); bad_escape: `\\x41` (not a JSON escape) after the arguments' first double quote;
wrong_tool_name: the function's name gets `_unknown` appended; duplicate_call: the call comes twice (the copy at
the next index, its id with `-2` appended, before the final event); finish_stop: finish_reason `tool_calls`
becomes `stop`. schema_break (requests with response_format json_schema): the answer's JSON object loses the
first required property it has (drop_required), or that property (else its first) gets a value of another type
(wrong_type: a string becomes its length, anything else the string "wrong type"); a streamed answer's content
is held back and sent as one delta before the final event."""

from __future__ import annotations

import json
import re
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from chaoskit.injectors.llm_proxy.faults import Fault, SchemaBreakParams, ToolArgsParams

BAD_ESCAPE = "\\x41"
_DATA = re.compile(rb"^data:[ ]?(.*)$", re.MULTILINE)


def parse_event(ev: bytes) -> dict[str, Any] | None:
    """The JSON object of an SSE event's data line, None when it has none (a comment, [DONE], bad JSON)."""
    m = _DATA.search(ev)
    if m is None or not m.group(1).lstrip().startswith(b"{"):
        return None
    try:
        doc = json.loads(m.group(1))
    except ValueError:
        return None
    return doc if isinstance(doc, dict) else None


def event_of(doc: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(doc).encode() + b"\n\n"


def request_schema(body: bytes) -> dict[str, Any] | None:
    """The JSON Schema a chat request's response_format json_schema asks for, or None."""
    try:
        doc = json.loads(body)
        schema = doc["response_format"]["json_schema"]["schema"]
    except (ValueError, KeyError, TypeError):
        return None
    return schema if isinstance(schema, dict) and doc["response_format"].get("type") == "json_schema" else None


def break_arguments(args: str, mode: str) -> str:
    """tool_args on arguments (a whole answer's, or a stream's fragment: cut then halves that fragment)."""
    if mode == "cut":
        return args[:len(args) // 2]
    if mode == "invalid_json":
        return args.replace('"', "'")
    if mode == "bad_escape" and '"' in args:
        i = args.index('"') + 1
        return args[:i] + BAD_ESCAPE + args[i:]
    return args


def break_schema(text: str, schema: dict[str, Any], mode: str) -> str | None:
    """The answer's JSON object with its first required property dropped or mistyped; None where the answer is
    no JSON object or has nothing to break (drop_required: no required property present)."""
    try:
        doc = json.loads(text)
    except ValueError:
        return None
    if not isinstance(doc, dict) or not doc:
        return None
    required = [k for k in schema.get("required") or () if k in doc]
    if mode == "drop_required":
        if not required:
            return None
        del doc[required[0]]
    else:
        key = required[0] if required else next(iter(doc))
        doc[key] = len(doc[key]) if isinstance(doc[key], str) else "wrong type"
    return json.dumps(doc)


class Rewrite:
    """tool_args and/or schema_break on one answer; `applied` is called once per fault whose effect happened."""

    def __init__(self, tool_args: Fault[ToolArgsParams] | None, schema_break: Fault[SchemaBreakParams] | None,
                 request_body: bytes):
        self.tool_args, self.schema_break = tool_args, schema_break
        self.mode = tool_args.params.mode if tool_args is not None else ""
        self.schema = request_schema(request_body) if schema_break is not None else None
        self.done: set[str] = set()  # the faults applied on this answer (each counted once)
        self.calls: dict[int, dict[str, Any]] = {}  # a streamed answer's tool calls so far: index -> id, name, args
        self.held: dict[str, Any] | None = None  # cut: the latest event with argument fragments, held back
        self.content: list[str] = []  # schema_break: a streamed answer's content, held back
        self.envelope: dict[str, Any] | None = None  # ... and the first event that held some (its id, model ...)
        self.touched = False  # the event being rewritten was changed (it is re-encoded)

    def applied(self, f: Fault[ToolArgsParams] | Fault[SchemaBreakParams]) -> None:
        if f.name not in self.done:
            self.done.add(f.name)
            f.applied += 1

    # ---------------------------------------------------------------- a whole answer

    def whole(self, body: bytes) -> bytes:
        """A non-streamed chat answer's JSON with the faults' effects (unchanged where none applies)."""
        try:
            doc = json.loads(body)
        except ValueError:
            return body
        changed = False
        for choice in doc.get("choices") or () if isinstance(doc, dict) else ():
            msg = choice.get("message") if isinstance(choice, dict) else None
            if not isinstance(msg, dict):
                continue
            if self.tool_args is not None and msg.get("tool_calls"):
                changed |= self._calls(choice, msg)
            if self.schema is not None and isinstance(msg.get("content"), str):
                broken = break_schema(msg["content"], self.schema, self.schema_break.params.mode)
                if broken is not None:
                    msg["content"], changed = broken, True
                    self.applied(self.schema_break)
        return json.dumps(doc).encode() if changed else body

    def _calls(self, choice: dict[str, Any], msg: dict[str, Any]) -> bool:
        calls = [c for c in msg["tool_calls"] if isinstance(c, dict) and isinstance(c.get("function"), dict)]
        if not calls:
            return False
        mode, first = self.mode, calls[0]["function"]
        if mode == "wrong_tool_name":
            first["name"] = f"{first.get('name')}_unknown"
        elif mode == "duplicate_call":
            msg["tool_calls"].append({**calls[0], "id": f"{calls[0].get('id')}-2",
                                      "function": dict(calls[0]["function"])})
        elif mode == "finish_stop":
            if choice.get("finish_reason") != "tool_calls":
                return False
            choice["finish_reason"] = "stop"
        else:
            args = first.get("arguments")
            if not isinstance(args, str) or break_arguments(args, mode) == args:
                return False
            first["arguments"] = break_arguments(args, mode)
        self.applied(self.tool_args)
        return True

    # ---------------------------------------------------------------- a streamed answer

    def event(self, ev: bytes) -> list[bytes]:
        """The events to send in place of `ev` (none while held back, several when held ones come out)."""
        doc = parse_event(ev)
        if doc is None or not isinstance(doc.get("choices"), list):
            return [*self.flush(), ev]
        self.touched = False
        finish = any(isinstance(c, dict) and c.get("finish_reason") for c in doc["choices"])
        fragments = self.tool_args is not None and self._tool_deltas(doc)
        if self.schema is not None and self._hold_content(doc, finish):
            return []
        out: list[bytes] = []
        if self.mode == "cut":  # hold the latest fragment back until the next event says whether it was the last
            if fragments and not finish:
                prev, self.held = self.held, doc
                return [event_of(prev)] if prev is not None else []
            if self.held is not None:
                out.append(event_of(self.held if fragments else self._cut(self.held)))
                self.held = None
            if fragments:
                self._cut(doc)
        if finish and self.tool_args is not None:
            out += self._at_finish(doc)
        if finish and self.schema is not None:
            out += self._release_content(doc)
        return [*out, event_of(doc) if self.touched else ev]

    def flush(self) -> list[bytes]:
        """The end of the stream (its [DONE], or the upstream's end): what is still held back."""
        out = []
        if self.held is not None:
            out.append(event_of(self._cut(self.held)))
            self.held = None
        if self.content:
            out += self._release_content(None)
        return out

    def _deltas(self, doc: dict[str, Any]) -> list[dict[str, Any]]:
        """The tool-call deltas of a streamed event (each with its function object)."""
        out = []
        for choice in doc["choices"]:
            delta = choice.get("delta") if isinstance(choice, dict) else None
            calls = delta.get("tool_calls") if isinstance(delta, dict) else None
            out += [tc for tc in calls or () if isinstance(tc, dict) and isinstance(tc.get("function"), dict)]
        return out

    def _tool_deltas(self, doc: dict[str, Any]) -> bool:
        """Note the event's tool-call deltas (and change them, per mode); whether it has argument fragments."""
        frags = False
        for tc in self._deltas(doc):
            fn = tc["function"]
            call = self.calls.setdefault(int(tc.get("index", 0)), {"id": "", "name": "", "arguments": ""})
            call["id"] = tc.get("id") or call["id"]
            if fn.get("name"):
                call["name"] = fn["name"]
                if self.mode == "wrong_tool_name":
                    fn["name"] = f"{fn['name']}_unknown"
                    self._did()
            args = fn.get("arguments")
            if not isinstance(args, str) or not args:
                continue
            frags = True
            first_quote = '"' in args and '"' not in call["arguments"]
            call["arguments"] += args
            if (self.mode == "invalid_json" and '"' in args) or (self.mode == "bad_escape" and first_quote):
                fn["arguments"] = break_arguments(args, self.mode)
                self._did()
        return frags

    def _did(self) -> None:
        self.touched = True
        self.applied(self.tool_args)

    def _cut(self, doc: dict[str, Any]) -> dict[str, Any]:
        """cut: the event's argument fragments lose their second half."""
        for tc in self._deltas(doc):
            if isinstance(tc["function"].get("arguments"), str) and tc["function"]["arguments"]:
                tc["function"]["arguments"] = break_arguments(tc["function"]["arguments"], "cut")
                self._did()
        return doc

    def _at_finish(self, doc: dict[str, Any]) -> list[bytes]:
        """finish_stop on the final event; duplicate_call: the copy, as one event before it."""
        out: list[bytes] = []
        for choice in doc["choices"]:
            if not isinstance(choice, dict) or choice.get("finish_reason") != "tool_calls":
                continue
            if self.mode == "finish_stop":
                choice["finish_reason"] = "stop"
                self._did()
            elif self.mode == "duplicate_call" and self.calls:
                call = self.calls[min(self.calls)]
                copy = {"index": max(self.calls) + 1, "id": f"{call['id']}-2", "type": "function",
                        "function": {"name": call["name"], "arguments": call["arguments"]}}
                extra = {**doc, "choices": [{"index": choice.get("index", 0), "delta": {"tool_calls": [copy]},
                                             "finish_reason": None}]}
                out.append(event_of(extra))
                self.applied(self.tool_args)
        return out

    def _hold_content(self, doc: dict[str, Any], finish: bool) -> bool:
        """schema_break: keep the event's content back; whether the event is then dropped (it had nothing else)."""
        held = False
        for choice in doc["choices"]:
            delta = choice.get("delta") if isinstance(choice, dict) else None
            if isinstance(delta, dict) and isinstance(delta.get("content"), str) and delta["content"]:
                self.content.append(delta.pop("content"))
                self.envelope = self.envelope or doc
                held = self.touched = True
        return held and not finish and not any(
            isinstance(c, dict) and set(c.get("delta") or {}) - {"role"} for c in doc["choices"])

    def _release_content(self, final: dict[str, Any] | None) -> list[bytes]:
        text, self.content = "".join(self.content), []
        if not text:
            return []
        assert self.schema_break is not None and self.schema is not None
        broken = break_schema(text, self.schema, self.schema_break.params.mode)
        if broken is not None:
            self.applied(self.schema_break)
        base = final or self.envelope or {}
        delta = {"role": "assistant", "content": broken if broken is not None else text}
        return [event_of({**base, "choices": [{"index": 0, "delta": delta, "finish_reason": None}]})]
