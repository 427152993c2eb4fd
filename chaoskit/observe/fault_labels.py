"""The labels of a fault as the exporters show it: its step, type and target (from the experiment as run)."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from chaoskit.model.events import FaultApplied, PlanStep

TARGET_KEYS = ("target", "kubernetes", "pid", "process", "upstream", "url", "listen", "path", "device")
MAX_TARGET = 120
_PART = re.compile(r"([A-Za-z_]+)\[(\d+)\]")


def compact(value: Any) -> str:
    """A spec value on one line: a map as k=v,k=v (sorted), a list joined by commas."""
    if isinstance(value, dict):
        return ",".join(f"{k}={compact(v)}" for k, v in sorted(value.items()) if v is not None)
    if isinstance(value, list):
        return ",".join(compact(v) for v in value)
    return str(value)


def step_node(document: Any, path: str) -> dict[str, Any] | None:
    """The step at `path` (`method[2].parallel[1]`) of the experiment document, or None."""
    node: Any = document
    for name, index in _PART.findall(path):
        node = node.get(name) if isinstance(node, dict) else None
        if not isinstance(node, list) or int(index) >= len(node):
            return None
        node = node[int(index)]
    return node if isinstance(node, dict) else None


def target_of(document: Any, plan: PlanStep) -> str:
    """What the planned fault acts on, as its spec names it (its variant's spec when a fallback ran)."""
    step = step_node(document, plan.path) if plan.path else None
    if step is None:
        return ""
    specs = [s for s in [step.get("inject"), *(step.get("fallback") or [])] if isinstance(s, dict)]
    spec = next((s for s in specs if s.get("type") == plan.type), specs[0] if specs else {})
    for key in TARGET_KEYS:
        if spec.get(key) not in (None, "", [], {}):
            text = compact(spec[key])
            return text if len(text) <= MAX_TARGET else text[:MAX_TARGET - 1] + "…"
    return ""


@dataclass
class FaultLabels:
    """Matches each applied fault to its planned step (by label and type, in plan order)."""

    document: Any = None
    plan: list[PlanStep] = field(default_factory=list)
    _used: set[int] = field(default_factory=set)

    def labels(self, ev: FaultApplied) -> dict[str, str]:
        """step, type and target of an applied fault."""
        index = next((i for i, p in enumerate(self.plan)
                      if i not in self._used and p.step == ev.step and (p.type or ev.type) == ev.type), None)
        target = ""
        if index is not None:
            self._used.add(index)
            target = target_of(self.document, self.plan[index])
        return {"step": ev.step, "type": ev.type, "target": target}
