"""Facts of an experiment's target, by placeholder name: {target.url}, {target.replica_pids[1]} and so on."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from chaoskit.errors import PreflightError


def reference_facts(engine: str) -> dict[str, Any]:
    """Facts published by `chaoskit ref up` (state dir .chaoskit/ref or $CHAOSKIT_REF_DIR)."""
    state = Path(os.environ.get("CHAOSKIT_REF_DIR", ".chaoskit/ref")) / "facts.json"
    try:
        facts = json.loads(state.read_text())
    except (OSError, ValueError):
        raise PreflightError(f"target.reference: {engine}: the reference deployment is not running "
                             f"(no {state}); start it with `chaoskit ref up --engine {engine}`") from None
    return facts


def addressable(prefix: str, facts: dict[str, Any]) -> dict[str, Any]:
    """Facts by name, and list facts item by item: {target.replica_pids[1]}, {target.replicas[1].pid}."""
    out: dict[str, Any] = {}
    for key, value in facts.items():
        out[f"{prefix}.{key}"] = value
        if isinstance(value, dict):  # a neighbour deployment's facts: {target.neighbour.url}
            out.update(addressable(f"{prefix}.{key}", value))
        if isinstance(value, list):
            for i, item in enumerate(value):
                out[f"{prefix}.{key}[{i}]"] = item
                if isinstance(item, dict):
                    out.update({f"{prefix}.{key}[{i}].{k}": v for k, v in item.items()})
    return out


def target_facts(target: dict[str, Any], deployed: dict[str, Any] | None, strict: bool) -> tuple[
        dict[str, Any], list[str]]:
    """The experiment target's facts by placeholder name ({target.url}, {target.replica_pids[0]} ...): the
    deployment the run brought up (`deployed`), else a running reference deployment's, then `facts:` and `url:`
    of the target; (facts, notes). Not strict (validation, --dry-run): a reference not running is a note and
    its placeholders wait for run time."""
    facts: dict[str, Any] = {}
    notes: list[str] = []
    if deployed is not None:
        facts.update(addressable("target", deployed))
    elif isinstance(target.get("reference"), str):
        try:
            facts.update(addressable("target", reference_facts(target["reference"])))
        except PreflightError as e:
            if strict:
                raise
            notes.append(str(e))
    if isinstance(target.get("facts"), dict):
        facts.update({f"target.{k}": v for k, v in target["facts"].items()})
    if isinstance(target.get("url"), str):
        facts["target.url"] = target["url"].rstrip("/")
    return facts, notes
