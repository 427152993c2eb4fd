"""Warnings about a valid experiment that does not do what it seems to: a hold or delay that no client waits out."""

from __future__ import annotations

from collections.abc import Iterator
from fnmatch import fnmatch
from typing import Any
from urllib.parse import urlsplit

from chaoskit.experiment.models import Experiment, Step
from chaoskit.experiment.yamlsafe import Located, Path_
from chaoskit.injectors.gpu.cuda_fault import CudaFaultSpec
from chaoskit.injectors.kv_notify.fault import KvNotifySpec
from chaoskit.injectors.llm_proxy.fault import DelayFault, LlmProxySpec, StallFault, TokenDelayFault
from chaoskit.injectors.netem.fault import NetemSpec
from chaoskit.injectors.proxy.fault import LatencyToxic, ProxySpec, SlicerToxic, SlowCloseToxic
from chaoskit.injectors.proxy.server import split_addr


def hold_warnings(exp: Experiment, loc: Located) -> list[str]:
    """A delay or stall, in any fault that delays (an inject or a fallback), at least as long as its step
    (nothing it holds is answered while the fault lasts), or that every probe sending through the fault gives up
    on first (their request timeouts are all shorter or equal, so the fault shows as timeouts and never as slow
    answers)."""
    out = []
    for path, step in _inject_steps(exp.method, ("method",)):
        specs = [(("inject",), step.inject), *((("fallback", i), f) for i, f in enumerate(step.fallback))]
        for at_spec, spec in specs:
            clients = _clients_through(exp, spec)
            for where, seconds, what in _holds(spec):
                at = f"{loc.where((*path, *at_spec, *where))}: {what} {seconds:g}s"
                if step.duration is not None and seconds >= step.duration:
                    out.append(f"{at} is at least the step's duration ({step.duration:g}s): no request it holds "
                               "is answered while the fault is in effect")
                if clients and all(timeout <= seconds for _, timeout in clients):
                    names = ", ".join(f"'{name}' ({timeout:g}s)" for name, timeout in clients)
                    through = "sending through it" if _is_proxy(spec) else "that may send through it"
                    out.append(f"{at} is at least the request timeout of every probe {through} ({names}): they "
                               "give up first, so they see timeouts, never slow answers")
    return out


def _inject_steps(steps: list[Step], path: Path_) -> Iterator[tuple[Path_, Step]]:
    for i, step in enumerate(steps):
        if step.inject is not None:
            yield (*path, i), step
        elif step.parallel:
            yield from _inject_steps(step.parallel, (*path, i, "parallel"))


def _holds(spec: Any) -> Iterator[tuple[Path_, float, str]]:
    """(path in the spec, seconds, what) of each hold or delay the fault adds to a request (a packet's delay
    at least: a request's packets may each wait it)."""
    if isinstance(spec, LlmProxySpec):
        for i, f in enumerate(spec.faults):
            if isinstance(f, DelayFault):
                yield ("faults", i, "delay"), f.delay + f.jitter, "delay"
            elif isinstance(f, TokenDelayFault):
                yield ("faults", i, "delay"), f.delay + f.jitter, "token delay"
            elif isinstance(f, StallFault) and f.duration:
                yield ("faults", i, "duration"), f.duration, "stall"
    elif isinstance(spec, ProxySpec):
        for i, t in enumerate(spec.toxics):
            if isinstance(t, LatencyToxic):
                yield ("toxics", i, "latency"), t.latency + t.jitter, "latency"
            elif isinstance(t, SlowCloseToxic):
                yield ("toxics", i, "delay"), t.delay, "slow close"
            elif isinstance(t, SlicerToxic) and t.delay:
                yield ("toxics", i, "delay"), t.delay, "slice delay"
    elif isinstance(spec, NetemSpec) and spec.delay:
        yield ("delay",), spec.delay + spec.jitter, "delay"
    elif isinstance(spec, KvNotifySpec) and spec.delay:
        yield ("delay",), spec.delay, "notification delay"
    elif isinstance(spec, CudaFaultSpec):
        for kind in ("alloc", "launch", "sync"):
            rule = getattr(spec, kind)
            if rule is not None and rule.delay:
                yield (kind, "delay"), rule.delay, f"{kind} call delay"


def _is_proxy(spec: Any) -> bool:
    return isinstance(spec, LlmProxySpec | ProxySpec)


def _clients_through(exp: Experiment, spec: Any) -> list[tuple[str, float]]:
    """(probe name, per-request timeout) of the probes whose requests go through this fault: for a proxy, those
    sent to its listen address; for a fault on a network path or inside a server (netem, kv.notify, cuda_fault),
    whose path a spec does not tell, every probe that sends requests."""
    probes = [*exp.steady_state.probes, *(sg.probe for sg in exp.safeguards if not isinstance(sg.probe, str))]
    sent = [(p.name, r) for p in probes if (r := p.request_target()) is not None]
    if not _is_proxy(spec):
        return [(name, r.timeout) for name, r in sent]
    try:
        listen = split_addr(spec.listen)
    except ValueError:  # a listen address only known at run time
        return []
    return [(name, r.timeout) for name, r in sent
            if _addr(r.url) == listen and (not r.url_path or _held_path(spec, _path(r.url)))]


def _addr(url: str) -> tuple[str, int] | None:
    """(host, port) a URL sends to; None when that is not known now (a port still a run-time placeholder)."""
    try:
        u = urlsplit(url)
        return (u.hostname or "", u.port or (443 if u.scheme == "https" else 80)) if u.hostname else None
    except ValueError:
        return None


def _path(url: str) -> str:
    try:
        return urlsplit(url).path
    except ValueError:
        return "/"


def _held_path(spec: Any, path: str) -> bool:
    """Whether a request to `path` can be held: llm.proxy faults match paths (default: inference endpoints)."""
    if not isinstance(spec, LlmProxySpec):
        return True
    return any(fnmatch(path or "/", glob) for f in spec.faults for glob in f.match.paths())
