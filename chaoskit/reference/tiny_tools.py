"""tiny-openai's answers as pure functions, all decided by the prompt alone (deterministic): its greedy tokens,
which tool a chat request calls (if any), the arguments it gives it, and a JSON value valid against a schema.

When a request calls a tool (`tools` given, `tool_choice` not "none", the last message not a `tool` result):
- `tool_choice: {"type": "function", "function": {"name": N}}` calls N; `"required"` calls the first offered tool
  the last user message names (or the first offered tool);
- `"auto"` (the default) calls the first offered tool whose name the last user message contains as a word.
The arguments fill the tool's `parameters` schema (a json_schema answer its schema): a `NAME=VALUE` word in the
last user message sets top-level property NAME (taken as the property's type), every other value is generated
from the prompt's hash (see `fill`)."""

from __future__ import annotations

import hashlib
import json
import re
from typing import Any

_ASSIGN = re.compile(r"(?<![\w-])([A-Za-z_][\w-]*)=(\S+)")
SIMPLE_TYPES = ("object", "string", "number", "integer", "boolean", "array", "null")
WORDS = ("the", "a", "model", "token", "fast", "slow", "gpu", "cache", "node", "queue", "page", "block", "route",
         "retry", "shard", "batch", "stream", "reply", "prompt", "layer", "head", "vector", "kernel", "graph",
         "server", "client", "load", "time", "data", "fault", "chaos", "steady")


def tokens(prompt: str, n: int) -> list[str]:
    """The greedy answer to `prompt`: the same `n` words on every replica and every call (temperature 0)."""
    digest = hashlib.sha256(prompt.encode()).digest()
    return [" " + WORDS[(digest[i % len(digest)] + i) % len(WORDS)] for i in range(n)]


def last_user_text(messages: list[Any]) -> str:
    for m in reversed(messages):
        if isinstance(m, dict) and m.get("role") == "user":
            content = m.get("content")
            if isinstance(content, list):  # content parts: their text
                return " ".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
            return str(content or "")
    return ""


def tool_names(tools: list[Any]) -> list[str]:
    return [str(t["function"]["name"]) for t in tools
            if isinstance(t, dict) and isinstance(t.get("function"), dict) and t["function"].get("name")]


def chosen_tool(body: dict[str, Any]) -> str | None:
    """The tool this chat request calls, or None (a text answer); ValueError for a tool_choice naming no tool."""
    tools, choice, messages = body.get("tools") or [], body.get("tool_choice", "auto"), body.get("messages") or []
    names = tool_names(tools) if isinstance(tools, list) else []
    if not names or choice == "none":
        return None
    if isinstance(choice, dict):
        name = (choice.get("function") or {}).get("name")
        if name not in names:
            raise ValueError(f"tool_choice names {name!r}, not one of the tools offered ({', '.join(names)})")
        return str(name)
    if isinstance(messages[-1], dict) and messages[-1].get("role") == "tool":
        return None  # a tool's result came back: the answer is text
    said = set(re.findall(r"[\w-]+", last_user_text(messages)))
    named = [n for n in names if n in said]
    if choice == "required":
        return (named or names)[0]
    return named[0] if named else None


def tool_schema(body: dict[str, Any], name: str) -> dict[str, Any]:
    for t in body.get("tools") or []:
        if isinstance(t, dict) and isinstance(t.get("function"), dict) and t["function"].get("name") == name:
            params = t["function"].get("parameters")
            return params if isinstance(params, dict) else {"type": "object", "properties": {}}
    return {"type": "object", "properties": {}}


def arguments(body: dict[str, Any], name: str, prompt: str) -> str:
    """The JSON arguments of the call to `name`: NAME=VALUE words of the last user message, the rest generated."""
    return structured(body, tool_schema(body, name), f"{prompt}\0{name}")


def structured(body: dict[str, Any], schema: dict[str, Any], seed: str) -> str:
    """JSON valid against `schema`: its top-level properties from NAME=VALUE words of the last user message, the
    rest generated from `seed`."""
    given = dict(_ASSIGN.findall(last_user_text(body.get("messages") or [])))
    return json.dumps(fill(schema, seed, root=schema, given=given))


def _hash(seed: str) -> int:
    return int.from_bytes(hashlib.sha256(seed.encode()).digest()[:8], "big")


def _words(seed: str, n: int) -> str:
    return "".join(tokens(seed, n)).strip()


def _resolve(schema: dict[str, Any], root: dict[str, Any]) -> dict[str, Any]:
    """A local $ref (#/$defs/X, #/definitions/X) resolved; anyOf/oneOf/allOf: their first non-null branch."""
    for _ in range(32):
        ref = schema.get("$ref")
        if isinstance(ref, str) and ref.startswith("#/"):
            node: Any = root
            for part in ref[2:].split("/"):
                node = node.get(part, {}) if isinstance(node, dict) else {}
            schema = {**{k: v for k, v in schema.items() if k != "$ref"}, **node}
            continue
        for key in ("anyOf", "oneOf", "allOf"):
            branches = [b for b in schema.get(key) or () if isinstance(b, dict) and b.get("type") != "null"]
            if branches:
                schema = {**{k: v for k, v in schema.items() if k != key}, **branches[0]}
                break
        else:
            return schema
    return schema


def schema_type(schema: dict[str, Any]) -> str:
    t = schema.get("type")
    if isinstance(t, list):
        t = next((x for x in t if x != "null"), "null")
    if t in SIMPLE_TYPES:
        return str(t)
    return "object" if "properties" in schema else "array" if "items" in schema else "string"


def fill(schema: dict[str, Any], seed: str, root: dict[str, Any] | None = None,
         given: dict[str, str] | None = None) -> Any:
    """A value valid against `schema`, the same for the same seed: const and enum (a hashed pick), object (every
    property, given ones taken from `given`), array (minItems, at least 1, at most maxItems), string (words from
    the hash, within minLength/maxLength), integer and number (within minimum/maximum), boolean, null."""
    schema = _resolve(schema, root or schema)
    if "const" in schema:
        return schema["const"]
    h = _hash(seed)
    if isinstance(schema.get("enum"), list) and schema["enum"]:
        return schema["enum"][h % len(schema["enum"])]
    t = schema_type(schema)
    if t == "object":
        props = schema.get("properties") or {}
        out: dict[str, Any] = {}
        for key, sub in props.items():
            sub = _resolve(sub if isinstance(sub, dict) else {}, root or schema)
            if given and key in given:
                out[key] = coerce(given[key], sub)
            else:
                out[key] = fill(sub, f"{seed}/{key}", root or schema)
        return out
    if t == "array":
        lo, hi = int(schema.get("minItems", 1)), schema.get("maxItems")
        n = max(lo, 1) if hi is None else min(max(lo, 1), int(hi))
        items = schema.get("items") if isinstance(schema.get("items"), dict) else {}
        return [fill(items, f"{seed}[{i}]", root or schema) for i in range(n)]
    if t == "integer":
        lo, hi = int(schema.get("minimum", 0)), int(schema.get("maximum", 100))
        return lo + h % (hi - lo + 1) if hi >= lo else lo
    if t == "number":
        lo, hi = float(schema.get("minimum", 0.0)), float(schema.get("maximum", 100.0))
        return round(lo + (h % 1000) / 1000 * (hi - lo), 2) if hi >= lo else lo
    if t == "boolean":
        return h % 2 == 0
    if t == "null":
        return None
    text = _words(seed, 2)
    lo, hi = int(schema.get("minLength", 0)), schema.get("maxLength")
    text = (text + " " + text * lo)[:max(lo, len(text))] if len(text) < lo else text
    return text[:int(hi)] if hi is not None else text


def coerce(text: str, schema: dict[str, Any]) -> Any:
    """A NAME=VALUE word's value as the property's type (left a string where it does not read as one)."""
    t = schema_type(schema)
    try:
        if t == "integer":
            return int(text)
        if t == "number":
            return float(text)
        if t == "boolean" and text.lower() in ("true", "false"):
            return text.lower() == "true"
        if t in ("object", "array"):
            return json.loads(text)
    except ValueError:
        pass
    return text


def response_schema(body: dict[str, Any]) -> dict[str, Any] | None:
    """The JSON Schema a response_format asks the answer to follow ({} for json_object), or None (free text)."""
    rf = body.get("response_format")
    if not isinstance(rf, dict):
        return None
    if rf.get("type") == "json_schema":
        js = rf.get("json_schema")
        schema = js.get("schema") if isinstance(js, dict) else None
        if not isinstance(schema, dict):
            raise ValueError("response_format.json_schema.schema: a JSON Schema object is required")
        return schema
    if rf.get("type") == "json_object":
        return {"type": "object", "properties": {"answer": {"type": "string"}}}
    return None


def fragments(text: str, size: int = 6) -> list[str]:
    """`text` in pieces as a model streams it (a few characters each), one per token; at least one."""
    return [text[i:i + size] for i in range(0, len(text), size)] or [""]
