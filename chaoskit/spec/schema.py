"""The published JSON Schema of the experiment file: pydantic's, plus what the loader accepts before it
validates — `{...}` placeholders wherever a value may be substituted, and `- include: NAME` probe entries
and method steps."""

from __future__ import annotations

import copy
from typing import Any

from chaoskit.spec.models import Experiment

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


def experiment_schema() -> dict[str, Any]:
    schema = _allow_placeholders(copy.deepcopy(Experiment.model_json_schema(by_alias=True)))
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
    return schema
