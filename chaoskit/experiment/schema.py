"""The published JSON Schema of the experiment file: pydantic's, plus what the loader accepts before it
validates — `{...}` placeholders wherever a value may be substituted, and `- include: NAME` probe entries
and method steps — in standard draft 2020-12 keywords only (strict validators such as ajv accept it), with
each probe type's `expect` keys."""

from __future__ import annotations

import copy
from typing import Any

from chaoskit.experiment.models import Experiment
from chaoskit.probes import PROBES

DRAFT = "https://json-schema.org/draft/2020-12/schema"
_BOUNDS = {"gt": "exclusiveMinimum", "ge": "minimum", "lt": "exclusiveMaximum", "le": "maximum"}
_FOR_TYPE = {"string": ("pattern", "minLength", "maxLength", "format"),
             "number": ("exclusiveMinimum", "minimum", "exclusiveMaximum", "maximum", "multipleOf"),
             "integer": ("exclusiveMinimum", "minimum", "exclusiveMaximum", "maximum", "multipleOf")}
_NOT_STANDARD = {"discriminator"}  # OpenAPI's; the anyOf it annotates says the same
_TYPED = {k for keys in _FOR_TYPE.values() for k in keys}

PLACEHOLDER = {"type": "string", "pattern": r"\{[A-Za-z_][\w\-]*(\[\d+\])?(\.[A-Za-z_][\w\-]*(\[\d+\])?)*\}",
               "description": "a {NAME}, {var.NAME} or {target.FACT} placeholder, substituted before validation"}
INCLUDE = {"type": "object", "required": ["include"],
           "properties": {"include": {"type": "string", "pattern": r"^[A-Za-z0-9_.\-]+$",
                                      "description": "a probe definition probes/NAME.yaml; other keys override it"}},
           "description": "a reusable probe definition, included by name"}
SCALARS = {"string", "number", "integer", "boolean"}
NOT_SUBSTITUTED = {"type", "apiVersion", "kind", "include"}  # discriminators and fixed words


def _is_scalar(node: dict[str, Any]) -> bool:
    t = node.get("type")
    types = set(t) if isinstance(t, list) else {t} if t else set()
    return bool(types) and types <= SCALARS or "enum" in node or "const" in node


def _allow_placeholders(node: Any, key: str | None = None) -> Any:
    if isinstance(node, list):
        return [_allow_placeholders(x) for x in node]
    if not isinstance(node, dict):
        return node
    if key not in NOT_SUBSTITUTED and _is_scalar(node):
        outer = {k: node[k] for k in ("description", "default", "title") if k in node}
        inner = {k: v for k, v in node.items() if k not in outer}
        return {**outer, "anyOf": [inner, PLACEHOLDER]}
    out = {}
    for k, v in node.items():
        if k == "properties" and isinstance(v, dict):
            out[k] = {name: _allow_placeholders(sub, name) for name, sub in v.items()}
        else:
            out[k] = _allow_placeholders(v)
    return out


def _standard(node: Any) -> Any:
    """pydantic's gt/ge/lt/le (from Field bounds on string-or-number types) as the standard keywords, a list
    of types as anyOf one type each with the keywords that apply to it, and no OpenAPI `discriminator`."""
    if isinstance(node, list):
        return [_standard(x) for x in node]
    if not isinstance(node, dict):
        return node
    node = {_BOUNDS.get(k, k): _standard(v) for k, v in node.items() if k not in _NOT_STANDARD}
    if isinstance(node.get("type"), list):
        shared = {k: v for k, v in node.items() if k != "type" and k not in _TYPED}
        branches = [{"type": t, **{k: node[k] for k in _FOR_TYPE.get(t, ()) if k in node}} for t in node["type"]]
        return {**shared, "anyOf": branches} if "anyOf" not in shared else {**shared, "allOf": [
            {"anyOf": branches}]}
    return node


def _expect_keys(schema: dict[str, Any]) -> None:
    """Each probe type's `expect` takes only the keys it measures (nested maps for keys ending in '.')."""
    for cls in PROBES:
        spec = schema["$defs"].get(cls.Spec.__name__)
        if spec is None or "expect" not in spec.get("properties", {}):
            continue
        expect = spec["properties"]["expect"]
        tolerance = expect["additionalProperties"]["anyOf"][0]
        keys = cls.Spec.expect_keys
        props = {k: tolerance for k in keys if not k.endswith(".")}
        props |= {k[:-1]: {"type": "object", "additionalProperties": tolerance} for k in keys if k.endswith(".")}
        spec["properties"]["expect"] = {**{k: v for k, v in expect.items() if k != "additionalProperties"},
                                        "properties": props, "additionalProperties": False,
                                        **({"patternProperties": {p: tolerance for p in cls.Spec.expect_patterns}}
                                           if cls.Spec.expect_patterns else {})}


def experiment_schema() -> dict[str, Any]:
    schema = _allow_placeholders(copy.deepcopy(Experiment.model_json_schema(by_alias=True)))
    _expect_keys(schema)
    probes = schema["$defs"]["SteadyState"]["properties"]["probes"]
    probes["items"] = {"anyOf": [probes["items"], INCLUDE]}
    step = {"type": "object", "required": ["include"],
            "properties": {"include": {**INCLUDE["properties"]["include"],
                                       "description": "a method step faults/NAME.yaml; other keys override it"},
                           **{k: {} for k in schema["$defs"]["Step"]["properties"] if k != "inject"}},
            "additionalProperties": False, "description": "a reusable method step, included by name"}
    for steps in (schema["properties"]["method"], schema["$defs"]["Step"]["properties"]["parallel"]):
        holder = steps if "items" in steps else next(x for x in steps["anyOf"] if x.get("type") == "array")
        holder["items"] = {"anyOf": [holder["items"], step]}
    return {"$schema": DRAFT, **_standard(schema)}
