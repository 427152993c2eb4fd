"""The reference deployment an experiment declares (target.reference as a mapping): reuse a running one with
the same settings, or bring one up for the run, ledgered with its own watchdog, and take it down after."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from chaoskit.engine import watchdog
from chaoskit.engine.ledger import Ledger
from chaoskit.engine.rollback import rollback
from chaoskit.errors import ChaoskitError, PreflightError
from chaoskit.reference.deploy import Deployment, RefOptions, _port_free, ref_dir
from chaoskit.spec.models import Reference

FIRST_PORT, PORT_STRIDE = 18000, 40


def options(ref: Reference, port: int = 0) -> RefOptions:
    params = {k: str(v).lower() if isinstance(v, bool) else str(v) for k, v in ref.model_params.items()}
    return RefOptions(engine=ref.engine, replicas=ref.replicas, port=ref.port or port, netns=ref.netns,
                      health=ref.health, latency_threshold_ms=ref.latency_threshold * 1e3, model_params=params)


def describe(ref: Reference) -> str:
    params = ", ".join(f"{k}={v}" for k, v in options(ref).model_params.items())
    return (f"{ref.engine} x{ref.replicas}, health {ref.health}"
            + (f" ({ref.latency_threshold * 1e3:g} ms)" if ref.health == "latency" else "")
            + (", netns" if ref.netns else "") + (f", {params}" if params else ""))


def _running_with(d: Path, settings: dict[str, Any]) -> dict[str, Any] | None:
    dep = Deployment(d)
    facts = dep.facts()
    if not facts or facts.get("settings") != settings:
        return None
    st = dep.status()
    return facts if st["processes"] and all(p["alive"] and p["ready"] for p in st["processes"]) else None


def _free_port(replicas: int) -> int:
    for k in range(100):
        base = FIRST_PORT + PORT_STRIDE * k
        if all(_port_free("127.0.0.1", p) for p in range(base, base + 1 + 3 * replicas)):
            return base
    raise PreflightError(f"no free block of {1 + 3 * replicas} ports from {FIRST_PORT}; set target.reference.port")


@contextmanager
def deployment_for(ref: Reference, run_id: str, experiment: str, say: Callable[[str], None]) -> Iterator[dict[str, Any]]:
    """Yield the facts of a deployment with these settings: a running one (left running), or a new one that
    is taken down when the block ends, also on an exception or interrupt (and by the watchdog if we die)."""
    settings = options(ref).settings()
    digest = hashlib.sha256(json.dumps(settings, sort_keys=True).encode()).hexdigest()[:10]
    own = ref_dir().parent / f"ref-{digest}"
    for d in (ref_dir(), own):
        facts = _running_with(d, settings)
        if facts is not None:
            say(f"reusing the running reference deployment in {d} ({describe(ref)})")
            yield facts
            return
    dep = Deployment(own)
    if dep.processes():
        dep.down(say=lambda _m: None)  # records of one whose run died: stop what is left of it
    ledger = Ledger.create(f"{run_id}-deployment", experiment)
    try:
        watchdog.spawn(ledger)
    except watchdog.WatchdogError as e:
        ledger.close()
        raise PreflightError(f"no watchdog, so the reference deployment was not started: {e}") from None
    record = {"dir": str(dep.root)}
    entry = ledger.intent("reference.deployment", record, [f"start {describe(ref)} in {dep.root}"])
    try:
        say(f"starting the reference deployment: {describe(ref)} (state {dep.root})")
        try:
            facts = dep.up(options(ref, port=ref.port or _free_port(ref.replicas)), say=say)
        except PreflightError:
            raise
        except ChaoskitError as e:
            raise PreflightError(f"the reference deployment did not start: {e}") from None
        ledger.applied(entry, record)
        yield facts
    finally:
        say("stopping the reference deployment")
        result = rollback(ledger)
        for _, why in result.failed:
            say(f"could not stop the reference deployment in {dep.root}: {why}; "
                f"`chaoskit ref down --dir {dep.root}`")
