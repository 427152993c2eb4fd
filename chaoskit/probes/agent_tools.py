"""The agent probe's local tools and the checks of a tool call: deterministic answers (tiny-mcp serves the same
functions over MCP), their OpenAI tool definitions, and whether a call's arguments (or a structured answer) fit a
JSON Schema."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from typing import Any

SKIES = ("sunny", "cloudy", "rain", "snow", "fog", "wind")


def _h(*parts: object) -> int:
    return int.from_bytes(hashlib.sha256("\0".join(map(str, parts)).encode()).digest()[:8], "big")


def weather(city: str, days: int = 1) -> str:
    h = _h("weather", city, days)
    return f"{city}: {days} day(s), {h % 35 - 5} C, {SKIES[(h >> 8) % len(SKIES)]}"


def clock(zone: str = "UTC") -> str:
    h = _h("time", zone)
    return f"{h % 24:02d}:{(h >> 8) % 60:02d} {zone}"


def lookup(key: str) -> str:
    return f"{key}: {_h('lookup', key) % 10**6:06d}"


def _schema(required: list[str], **props: tuple[str, Any]) -> dict[str, Any]:
    properties = {k: {"type": t, **({} if d is None else {"default": d})} for k, (t, d) in props.items()}
    return {"type": "object", "properties": properties, "required": required}


# name: (description, parameters, the function); the parameters as tiny-mcp's tools/list gives them
LOCAL: dict[str, tuple[str, dict[str, Any], Callable[..., str]]] = {
    "get_weather": ("the weather in a city for some days",
                    _schema(["city"], city=("string", None), days=("integer", 1)), weather),
    "get_time": ("the time in a time zone", _schema([], zone=("string", "UTC")), clock),
}


def openai_tool(name: str, description: str, parameters: dict[str, Any]) -> dict[str, Any]:
    return {"type": "function", "function": {"name": name, "description": description, "parameters": parameters}}


def run_local(name: str, args: dict[str, Any]) -> str:
    """A local tool's answer (KeyError: no such tool; TypeError: arguments it does not take)."""
    return LOCAL[name][2](**args)


_TYPES: dict[str, Callable[[Any], bool]] = {
    "string": lambda v: isinstance(v, str),
    "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
    "number": lambda v: isinstance(v, int | float) and not isinstance(v, bool),
    "boolean": lambda v: isinstance(v, bool),
    "array": lambda v: isinstance(v, list),
    "object": lambda v: isinstance(v, dict),
    "null": lambda v: v is None,
}


def parse_arguments(text: str, schema: dict[str, Any]) -> tuple[dict[str, Any] | None, str | None]:
    """(the arguments, None) when `text` is a JSON object that fits the tool's schema (see parse_object), else
    (None, why not)."""
    return parse_object(text, schema, "arguments", "argument")


def parse_object(text: str, schema: dict[str, Any], what: str = "the answer",
                 part: str = "property") -> tuple[dict[str, Any] | None, str | None]:
    """(the object, None) when `text` is a JSON object that fits `schema` (its required properties, the types and
    enums of its top-level properties, no others where additionalProperties is false), else (None, why not)."""
    try:
        doc = json.loads(text)
    except ValueError as e:
        return None, f"{what}: not JSON ({e}): {text[:80]!r}"
    if not isinstance(doc, dict):
        return None, f"{what}: not a JSON object: {text[:80]!r}"
    props = schema.get("properties") or {}
    missing = [k for k in schema.get("required") or () if k not in doc]
    if missing:
        return None, f"{what}: required {', '.join(missing)} missing"
    for key, value in doc.items():
        sub = props.get(key)
        if sub is None:
            if schema.get("additionalProperties") is False:
                return None, f"{part} {key} is not in the schema"
            continue
        types = sub.get("type") if isinstance(sub, dict) else None
        types = [types] if isinstance(types, str) else types or []
        if types and not any(_TYPES.get(t, lambda _: True)(value) for t in types):
            return None, f"{part} {key}: {json.dumps(value)[:40]} is not {' or '.join(types)}"
        if isinstance(sub, dict) and isinstance(sub.get("enum"), list) and value not in sub["enum"]:
            return None, f"{part} {key}: {json.dumps(value)[:40]} is not one of its enum"
    return doc, None
