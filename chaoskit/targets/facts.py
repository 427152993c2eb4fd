"""Facts of an experiment's target, by placeholder name: {target.url}, {target.replica_pids[1]} and so on."""

from __future__ import annotations

import difflib
import itertools
import json
import re
from dataclasses import dataclass
from typing import Any

from chaoskit.errors import PreflightError
from chaoskit.targets.ref_registry import FACTS, command, facts_dir, search

# What reference/deploy.py publishes (tests/integration/test_reference.py checks a real deployment against these).
REFERENCE_FACTS = ("engine", "url", "gateway_port", "health_mode", "replicas", "replica_url", "replica_host",
                   "replica_port", "replica_metrics_url", "replica_pid", "replica_pids", "model_repository",
                   "python", "model", "startup_s", "settings", "gateway", "gateway_pid")
GATEWAY_FACTS = ("kind", "version", "config", "settings", "tap_log", "tap_metrics")  # {target.gateway.kind} ...
REPLICA_FACTS = ("name", "pid", "host", "port", "url", "metrics_url", "netns")
VLLM_REPLICA_FACTS = ("engine_pid",)
OPENAI_REPLICA_FACTS = ("request_log",)  # engine tiny-openai: its JSON line per request
PD_FACTS = ("prefill_pid", "prefill_pids", "prefill_url", "decode_url", "decode_pid", "decode_kv",  # disaggregated
            "decode_kv_port")
PD_REPLICA_FACTS = ("role", "kv")
MCP_FACTS = ("url", "pid", "port", "request_log")  # with mcp: tiny-mcp, {target.mcp.url} ...
TRITON_REPLICA_FACTS = ("model_pids",)
# The bundled model repository's models: a Triton replica's model_pids are their python backend stubs, in this order.
TRITON_MODELS = ("tiny_lm", "tiny_lm_stream")
_INDEX = re.compile(r"\[\d+\]")


def reference_facts(engine: str) -> dict[str, Any]:
    """Facts published by `chaoskit ref up`: of the deployment in $CHAOSKIT_REF_DIR when that is set, else of the
    one running in the working directory's .chaoskit/ref or, failing that, the one running deployment of the
    registry (chaoskit.targets.ref_registry). Not found: a PreflightError naming every place looked."""
    root, why = facts_dir(search(), engine or "triton")
    if root is None:
        raise PreflightError(f"target.reference: {engine}: {why}")
    state = root / FACTS
    try:
        facts = json.loads(state.read_text())
    except (OSError, ValueError) as e:
        raise PreflightError(f"target.reference: {engine}: cannot read the reference deployment's facts {state}: "
                             f"{e}") from None
    if not isinstance(facts, dict):
        raise PreflightError(f"target.reference: {engine}: {state} is not a JSON object of facts; "
                             f"`{command('down', root)}` and `chaoskit ref up` again")
    return facts


def addressable(prefix: str, facts: dict[str, Any]) -> dict[str, Any]:
    """Facts by name, and list facts item by item, at any depth: {target.replica_pids[1]}, {target.replicas[1].pid},
    {target.replicas[1].model_pids} (the whole list) and {target.replicas[1].model_pids[0]}."""
    out: dict[str, Any] = {}
    for key, value in facts.items():
        out[f"{prefix}.{key}"] = value
        if isinstance(value, dict):  # a neighbour deployment's facts: {target.neighbour.url}
            out.update(addressable(f"{prefix}.{key}", value))
        if isinstance(value, list):
            for i, item in enumerate(value):
                out[f"{prefix}.{key}[{i}]"] = item
                if isinstance(item, dict):
                    out.update(addressable(f"{prefix}.{key}[{i}]", item))
    return out


@dataclass(frozen=True)
class Pending:
    """The facts a deployment not yet known will publish: their placeholder names, and whether list indices
    can be checked (the replica count is known)."""

    names: frozenset[str]
    counted: bool
    replicas: int | None = None

    def has(self, key: str) -> bool:
        return key in self.names if self.counted else _first(key) in self.names

    def unknown(self, key: str) -> str:
        """Why `key` is not one of these facts: an index past the replicas, or a name they do not have."""
        if self.counted and _first(key) in self.names:
            return f"unknown substitution {{{key}}}: index out of range, {self._out_of_range(key)}"
        hint = difflib.get_close_matches(key if self.counted else _first(key), sorted(self.names), n=1)
        return f"unknown substitution {{{key}}}" + (f" (did you mean {{{hint[0]}}}?)" if hint else "") + \
            f"; a reference deployment provides {self.listing()}"

    def _out_of_range(self, key: str) -> str:
        """Which list of `key` (whose names all exist at index 0) it indexes past the end, and its length."""
        for m in _INDEX.finditer(key):
            head, index = key[:m.start()], int(m.group(0)[1:-1])
            size = next(i for i in itertools.count() if f"{head}[{i}]" not in self.names)
            if index < size:
                continue
            if head in ("target.replicas", "target.replica_pids"):
                return (f"the deployment has {size} replica{'s' if size != 1 else ''} "
                        f"(indices 0..{max(size, 1) - 1})")
            return (f"{head.removeprefix('target.')} has {size} item{'s' if size != 1 else ''} "
                    f"(indices 0..{max(size, 1) - 1})")
        return "an index is past the end of its list"

    def listing(self) -> str:
        top = sorted(n.removeprefix("target.") for n in self.names if "[" not in n and ".settings." not in n)
        per = sorted({n.split("].", 1)[1] for n in self.names
                      if n.startswith("target.replicas[0].") and "[" not in n.split("].", 1)[1]})
        return f"{{target.NAME}}: {', '.join(top)}; and per replica {{target.replicas[N].NAME}}: {', '.join(per)}"


def _first(key: str) -> str:
    """The key with every list index 0 (a name check where the replica count is not known)."""
    return _INDEX.sub("[0]", key)


def reference_shape(engine: str, replicas: int = 1, netns: bool = False,
                    neighbour: dict[str, Any] | None = None,
                    disaggregated: tuple[int, int] | None = None, mcp: bool = False) -> dict[str, Any]:
    """The facts `chaoskit ref up` (deploy.py) publishes for this engine and replica count, values unknown:
    the same keys, so a placeholder can be checked before the deployment exists. A disaggregated deployment's
    replicas are its decode servers, then its prefill servers; with mcp, tiny-mcp's facts are {target.mcp.*}."""
    shape: dict[str, Any] = dict.fromkeys(REFERENCE_FACTS + (("netns",) if netns else ()))
    shape["replicas"] = [_replica_shape(engine) for _ in range(replicas)]
    shape["replica_pids"] = [None] * replicas
    shape["settings"] = dict.fromkeys(("engine", "replicas", "netns", "model_params"))
    shape["gateway"] = dict.fromkeys(GATEWAY_FACTS)
    if disaggregated is not None:
        servers = sum(disaggregated)
        shape |= dict.fromkeys(PD_FACTS + (("decode_netns",) if netns else ()))
        shape["replicas"] = [dict.fromkeys(REPLICA_FACTS + PD_REPLICA_FACTS) for _ in range(servers)]
        shape["replica_pids"], shape["prefill_pids"] = [None] * servers, [None] * disaggregated[0]
        shape["settings"]["disaggregated"] = None
    if neighbour is not None:
        shape["neighbour"] = reference_shape(**neighbour)
    if mcp:
        shape["mcp"] = dict.fromkeys(MCP_FACTS)
    return shape


def _replica_shape(engine: str) -> dict[str, Any]:
    """One replica's facts for this engine, values unknown (a Triton replica's model_pids: one per model)."""
    if engine == "vllm":
        return dict.fromkeys(REPLICA_FACTS + VLLM_REPLICA_FACTS)
    if engine == "tiny-openai":
        return dict.fromkeys(REPLICA_FACTS + OPENAI_REPLICA_FACTS)
    replica: dict[str, Any] = dict.fromkeys(REPLICA_FACTS + TRITON_REPLICA_FACTS)
    replica["model_pids"] = [None] * len(TRITON_MODELS)
    return replica


def pending_shape(shape: dict[str, Any], counted: bool = True) -> Pending:
    """The placeholder names of a deployment's shape (see reference_shape)."""
    replicas = len(shape["replicas"]) if counted else None
    return Pending(frozenset(addressable("target", shape)), counted, replicas)


def reference_running() -> bool:
    """Whether `chaoskit ref up` facts are published (see reference_facts)."""
    try:
        reference_facts("")
        return True
    except PreflightError:
        return False


def target_facts(target: dict[str, Any], deployed: dict[str, Any] | None, strict: bool) -> tuple[
        dict[str, Any], list[str]]:
    """The experiment target's facts by placeholder name ({target.url}, {target.replica_pids[0]} ...): the
    deployment the run brought up (`deployed`), else a running reference deployment's, then `facts:` and `url:`
    of the target; (facts, notes). Not strict (validation, --dry-run): a reference not running is a note and
    its placeholders wait for run time (Pending says which names they may have)."""
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
