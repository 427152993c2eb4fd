"""The reference deployment an experiment declares (target.reference as a mapping): reuse a running one with
the same settings, or bring one up for the run, ledgered with its own watchdog, and take it down after."""

from __future__ import annotations

import hashlib
import json
import os
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from chaoskit.engine import watchdog
from chaoskit.engine.ledger import Ledger
from chaoskit.engine.rollback import rollback
from chaoskit.errors import ChaoskitError, PreflightError
from chaoskit.experiment.models import Reference
from chaoskit.model.gateways import CHAOSKIT as GATEWAY_CHAOSKIT
from chaoskit.model.gateways import PARAMS as GATEWAY_PARAMS
from chaoskit.reference.deploy import Deployment, RefOptions, port_free, ref_dir
from chaoskit.targets.ref_registry import every_dir

FIRST_PORT, PORT_STRIDE = 18000, 40  # FIRST_PORT: unless $CHAOSKIT_REF_FIRST_PORT says otherwise


def first_port() -> int:
    """Where the search for a free block of ports starts: $CHAOSKIT_REF_FIRST_PORT (two runs started at once,
    e.g. two CI jobs on one host, each its own range), else FIRST_PORT."""
    raw = os.environ.get("CHAOSKIT_REF_FIRST_PORT", "")
    if not raw:
        return FIRST_PORT
    if not raw.isdigit() or not 1024 <= int(raw) <= 65000:
        raise PreflightError(f"CHAOSKIT_REF_FIRST_PORT={raw}: not a port number from 1024 to 65000")
    return int(raw)


def options(ref: Reference, port: int = 0) -> RefOptions:
    params = {k: str(v).lower() if isinstance(v, bool) else str(v) for k, v in ref.model_params.items()}
    split = (ref.disaggregated.prefill, ref.disaggregated.decode) if ref.disaggregated else None
    gateway_params = {k: str(v).lower() if isinstance(v, bool) else str(v) for k, v in ref.gateway_params.items()}
    return RefOptions(engine=ref.engine, replicas=ref.replicas, port=ref.port or port, netns=ref.netns,
                      health=ref.health, latency_threshold_ms=ref.latency_threshold * 1e3, model_params=params,
                      disaggregated=split, gateway=ref.gateway, gateway_params=gateway_params, tap=ref.tap,
                      mcp=ref.mcp)


def describe(ref: Reference) -> str:
    params = ", ".join(f"{k}={v}" for k, v in options(ref).model_params.items())
    engine = (f"tiny_lm split: {ref.disaggregated.prefill} prefill + {ref.disaggregated.decode} decode"
              if ref.disaggregated else f"{ref.engine} x{ref.replicas}")
    gateway = ""
    if ref.gateway != GATEWAY_CHAOSKIT:
        settings = {**GATEWAY_PARAMS[ref.gateway].defaults, **options(ref).gateway_params}
        gateway = f", gateway {ref.gateway} ({', '.join(f'{k}={v}' for k, v in settings.items())})"
    return (f"{engine}{gateway}, health {ref.health}"
            + (f" ({ref.latency_threshold * 1e3:g} ms)" if ref.health == "latency" else "")
            + (", netns" if ref.netns else "") + (", tiny-mcp" if ref.mcp else "") + (f", {params}" if params else ""))


def _running_with(d: Path, settings: dict[str, Any]) -> dict[str, Any] | None:
    dep = Deployment(d)
    facts = dep.facts()
    if not facts or facts.get("settings") != settings:
        return None
    st = dep.status()
    return facts if st["processes"] and all(p["alive"] and p["ready"] for p in st["processes"]) else None


def gateway_health(url: str) -> dict[str, Any]:
    with urllib.request.urlopen(f"{url}/gateway/status", timeout=5) as r:
        st = json.loads(r.read())
    return {"health_mode": st["health_mode"], "latency_threshold_ms": st["latency_threshold_ms"]}


def set_gateway_health(url: str, health: dict[str, Any]) -> dict[str, Any]:
    """POST the health settings; the previous ones."""
    req = urllib.request.Request(f"{url}/gateway/config", data=json.dumps(health).encode(), method="POST",
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=5) as r:
        return json.loads(r.read())["previous"]


@contextmanager
def _reused(d: Path, facts: dict[str, Any], opts: RefOptions, ledger: Ledger,
            say: Callable[[str], None]) -> Iterator[dict[str, Any]]:
    """A running deployment with these replicas; its gateway switched to this run's health settings (ledgered,
    switched back after)."""
    if opts.third_party:  # its settings are part of the deployment's: the same already
        say(f"reusing the running reference deployment in {d} (gateway {opts.gateway})")
        yield facts
        return
    want = opts.health_settings()
    try:
        previous = gateway_health(facts["url"])
    except (OSError, ValueError, KeyError) as e:
        raise PreflightError(f"the running reference deployment in {d} does not answer /gateway/status: {e}") from None
    if previous == want:
        say(f"reusing the running reference deployment in {d}")
        yield facts
        return
    record = {"url": facts["url"], "previous": previous}
    entry = ledger.intent("reference.gateway", record, [f"gateway {facts['url']}: health {want}"])
    set_gateway_health(facts["url"], want)
    ledger.applied(entry, record)
    say(f"reusing the running reference deployment in {d}; its gateway's health checks switched to "
        f"{want['health_mode']} for this run")
    yield {**facts, "health_mode": want["health_mode"]}


def free_port_block(servers: int) -> int:
    """The first block of ports from first_port() free for a gateway and `servers` replicas (3 ports each)."""
    first = first_port()
    for k in range(100):
        base = first + PORT_STRIDE * k
        if base + 3 * servers > 65535:
            break
        if all(port_free("127.0.0.1", p) for p in range(base, base + 1 + 3 * servers)):
            return base
    raise PreflightError(f"no free block of {1 + 3 * servers} ports from {first}; set target.reference.port")


@contextmanager
def deployment_for(ref: Reference, run_id: str, experiment: str, say: Callable[[str], None]) -> Iterator[dict[str, Any]]:
    """Yield the facts of a deployment with these settings (and of its neighbour, under "neighbour"): a running
    one (left running; only its gateway's health settings are switched for the run), or a new one that is
    taken down when the block ends, also on an exception or interrupt (and by the watchdog if we die)."""
    ledger = Ledger.create(f"{run_id}-deployment", experiment)
    try:
        try:
            watchdog.spawn(ledger)
        except watchdog.WatchdogError as e:
            raise PreflightError(f"no watchdog, so the reference deployment was not started: {e}") from None
        with _one(ref, ledger, say) as facts:
            if ref.neighbour is None:
                yield facts
            else:
                with _one(ref.neighbour, ledger, say) as neighbour:
                    yield {**facts, "neighbour": neighbour}
    finally:
        result = rollback(ledger)
        for entry, why in result.failed:
            say(f"could not undo {entry.type} {entry.record}: {why}; `chaoskit rollback --ledger {ledger.path}`")
        if result.complete:  # closed, nothing left to undo: removed, as a run's ledger is
            ledger.discard()


def _own_dir(opts: RefOptions) -> Path:
    digest = hashlib.sha256(json.dumps(opts.settings(), sort_keys=True).encode()).hexdigest()[:10]
    return ref_dir().parent / f"ref-{digest}"


def _candidates(opts: RefOptions) -> list[Path]:
    """Where a running deployment with these settings is looked for, in order."""
    return list(dict.fromkeys([*every_dir(), _own_dir(opts).resolve()]))


def looked_in(ref: Reference) -> list[Path]:
    """Every directory a run looks in for a running deployment with these settings (a dry run says them)."""
    return _candidates(options(ref)) + (_candidates(options(ref.neighbour)) if ref.neighbour is not None else [])


def _running(opts: RefOptions) -> tuple[Path, dict[str, Any]] | None:
    """A running deployment with these settings (`chaoskit ref up`'s: $CHAOSKIT_REF_DIR, else .chaoskit/ref or one
    of the registry's; else one a scenario left): (dir, facts)."""
    for d in _candidates(opts):
        if (facts := _running_with(d, opts.settings())) is not None:
            return d, facts
    return None


def running_facts(ref: Reference) -> dict[str, Any] | None:
    """The facts a run would reuse (running deployments with these settings, the neighbour's under "neighbour",
    the gateway's health as the run sets it), or None where the run would start one: what a dry run plans
    against."""
    found = _running(options(ref))
    neighbour = _running(options(ref.neighbour)) if ref.neighbour is not None else None
    if found is None or (ref.neighbour is not None and neighbour is None):
        return None
    facts = {**found[1], "health_mode": ref.health}
    return facts if neighbour is None else {**facts, "neighbour": neighbour[1]}


@contextmanager
def _one(ref: Reference, ledger: Ledger, say: Callable[[str], None]) -> Iterator[dict[str, Any]]:
    opts = options(ref)
    running = _running(opts)
    if running:
        with _reused(*running, opts, ledger, say) as facts:
            yield facts
    else:
        with _brought_up(Deployment(_own_dir(opts)), ref, ledger, say) as facts:
            yield facts


@contextmanager
def _brought_up(dep: Deployment, ref: Reference, ledger: Ledger,
                say: Callable[[str], None]) -> Iterator[dict[str, Any]]:
    if dep.processes():
        dep.down(say=lambda _m: None)  # records of one whose run died: stop what is left of it
    record = {"dir": str(dep.root)}
    entry = ledger.intent("reference.deployment", record, [f"start {describe(ref)} in {dep.root}"])
    say(f"starting the reference deployment: {describe(ref)} (state {dep.root})")
    try:
        servers = ref.disaggregated.prefill + ref.disaggregated.decode if ref.disaggregated else ref.replicas
        facts = dep.up(options(ref, port=ref.port or free_port_block(servers)), say=say)
    except PreflightError:
        raise
    except ChaoskitError as e:
        raise PreflightError(f"the reference deployment did not start: {e}") from None
    finally:
        ledger.applied(entry, record)  # applied or not, its revert (down) stops what started
    yield facts
    say("stopping the reference deployment")
