"""Warnings about a valid experiment that does not do what it seems to: a request hold that no client waits out."""

from __future__ import annotations

from collections.abc import Iterator
from fnmatch import fnmatch
from typing import Any
from urllib.parse import urlsplit

from chaoskit.experiment.models import Experiment, Step
from chaoskit.experiment.yamlsafe import Located, Path_
from chaoskit.injectors.llm_proxy import DelayFault, LlmProxySpec, StallFault
from chaoskit.injectors.proxy import LatencyToxic, ProxySpec, SlowCloseToxic
from chaoskit.injectors.proxy_server import split_addr
from chaoskit.probes.http import HttpProbeSpec
from chaoskit.probes.slo import SloProbeSpec


def hold_warnings(exp: Experiment, loc: Located) -> list[str]:
    """A delay or stall at least as long as its step (nothing it holds is answered while the fault lasts), or
    that every probe sending through the fault gives up on first (their request timeouts are all shorter, so
    the fault shows as timeouts and never as slow answers)."""
    out = []
    for path, step in _inject_steps(exp.method, ("method",)):
        clients = _clients_through(exp, step.inject)
        for where, seconds, what in _holds(step.inject):
            at = f"{loc.where((*path, 'inject', *where))}: {what} {seconds:g}s"
            if step.duration is not None and seconds >= step.duration:
                out.append(f"{at} is at least the step's duration ({step.duration:g}s): no request it holds is "
                           "answered while the fault is in effect (bare numbers are seconds)")
            if clients and all(timeout <= seconds for _, timeout in clients):
                names = ", ".join(f"'{name}' ({timeout:g}s)" for name, timeout in clients)
                out.append(f"{at} is at least the request timeout of every probe sending through it ({names}): "
                           "they give up first, so they see timeouts, never slow answers (bare numbers are "
                           "seconds)")
    return out


def _inject_steps(steps: list[Step], path: Path_) -> Iterator[tuple[Path_, Step]]:
    for i, step in enumerate(steps):
        if step.inject is not None:
            yield (*path, i), step
        elif step.parallel:
            yield from _inject_steps(step.parallel, (*path, i, "parallel"))


def _holds(spec: Any) -> Iterator[tuple[Path_, float, str]]:
    """(path in the inject spec, seconds, what) of each hold on a request the fault adds."""
    if isinstance(spec, LlmProxySpec):
        for i, f in enumerate(spec.faults):
            if isinstance(f, DelayFault):
                yield ("faults", i, "delay"), f.delay + f.jitter, "delay"
            elif isinstance(f, StallFault) and f.duration:
                yield ("faults", i, "duration"), f.duration, "stall"
    elif isinstance(spec, ProxySpec):
        for i, t in enumerate(spec.toxics):
            if isinstance(t, LatencyToxic):
                yield ("toxics", i, "latency"), t.latency + t.jitter, "latency"
            elif isinstance(t, SlowCloseToxic):
                yield ("toxics", i, "delay"), t.delay, "slow close"


def _clients_through(exp: Experiment, spec: Any) -> list[tuple[str, float]]:
    """(probe name, per-request timeout) of the probes whose requests go to this proxy's listen address."""
    if not isinstance(spec, LlmProxySpec | ProxySpec):
        return []
    listen = split_addr(spec.listen)
    out = []
    for p in exp.steady_state.probes:
        if isinstance(p, SloProbeSpec) and _addr(p.load.url) == listen:
            out.append((p.name, p.load.timeout))
        elif isinstance(p, HttpProbeSpec) and _addr(p.url) == listen and _held_path(spec, urlsplit(p.url).path):
            out.append((p.name, p.timeout))
    return out


def _addr(url: str) -> tuple[str, int] | None:
    u = urlsplit(url)
    return (u.hostname or "", u.port or (443 if u.scheme == "https" else 80)) if u.hostname else None


def _held_path(spec: Any, path: str) -> bool:
    """Whether a request to `path` can be held: llm.proxy faults match paths (default: inference endpoints)."""
    if not isinstance(spec, LlmProxySpec):
        return True
    return any(fnmatch(path or "/", glob) for f in spec.faults for glob in f.match.paths())
