"""What a run records about itself before it starts, so its report can be rebuilt from the journal alone: the
experiment exactly as run (after includes and substitution) with its tolerances and safeguard rules as data,
and the host's facts (kernel, CPUs, memory, and the quick `chaoskit doctor` checks)."""

from __future__ import annotations

import os
import platform
import socket
import sys
from typing import Any

from chaoskit import __version__
from chaoskit.experiment.loader import Loaded
from chaoskit.model.tolerance import Rule, Tolerance, parse_rule

# doctor checks left out of a run's host facts: they compile or create kernel objects (seconds, and they would
# disturb the experiment); `chaoskit doctor` runs them
SLOW_CHECKS = ("_ebpf", "_netem", "_load_sender")


def tolerance_json(tol: Tolerance) -> dict[str, Any]:
    out: dict[str, Any] = {"kind": tol.kind, "op": tol.op, "text": str(tol)}
    if tol.kind == "range":
        out.update(low=tol.low, high=tol.high)
    elif tol.kind == "baseline":
        out.update(expr=tol.value.text, scale=tol.value.scale, offset=tol.value.offset)
    elif tol.kind in ("cmp", "eq") and isinstance(tol.value, (int, float)) and not isinstance(tol.value, bool):
        out.update(value=float(tol.value))
    else:
        out.update(value=str(tol.value))
    return out


def rule_json(rule: Rule | Any) -> dict[str, Any]:
    rule = rule if isinstance(rule, Rule) else parse_rule(rule)
    tol = rule.tolerance
    value = float(tol.value) if tol.kind == "cmp" and isinstance(tol.value, float) else None
    return {"metric": rule.metric, "op": tol.op, "value": value, "text": str(rule)}


def experiment_record(loaded: Loaded) -> dict[str, Any]:
    """The journal's `experiment` event: the file, its variables, the document as run, tolerances, safeguards."""
    exp = loaded.experiment
    probes = list(exp.steady_state.probes) + [sg.probe for sg in exp.safeguards if not isinstance(sg.probe, str)]
    return {
        "file": str(loaded.path),
        "name": exp.metadata.name,
        "description": exp.metadata.description,
        "vars": loaded.variables,
        "document": loaded.located.data,
        "expect": {p.name: {k: tolerance_json(t) for k, t in p.flat_expect().items()} for p in probes},
        "safeguards": [{"probe": sg.probe if isinstance(sg.probe, str) else sg.probe.name,
                        "rules": [rule_json(r) for r in sg.rules()], "on_error": sg.on_error}
                       for sg in exp.safeguards],
    }


def host_facts() -> dict[str, Any]:
    """The journal's `host` event (about 50 ms: the doctor checks that neither compile nor create anything)."""
    from chaoskit.doctor import CHECKS

    u = os.uname()
    checks = []
    for fn in CHECKS:
        if fn.__name__ in SLOW_CHECKS:
            continue
        try:
            c = fn()
            checks.append({"area": c.area, "ok": c.ok, "detail": c.detail})
        except Exception as e:  # a broken check says so, as in `chaoskit doctor`
            checks.append({"area": fn.__name__.strip("_"), "ok": False, "detail": f"check failed: {e}"})
    try:
        mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):
        mem = None
    return {
        "hostname": socket.gethostname(),
        "kernel": f"{u.sysname} {u.release} {u.version}",
        "machine": u.machine,
        "cpus": os.cpu_count(),
        "memory_bytes": mem,
        "python": f"{platform.python_implementation()} {sys.version.split()[0]}",
        "chaoskit": __version__,
        "euid": os.geteuid(),
        "doctor": checks,
        "doctor_skipped": [f.strip("_") for f in SLOW_CHECKS],
    }
