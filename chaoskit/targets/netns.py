"""Resolve a network target (namespace by name or PID, interface) and run code inside that namespace."""

from __future__ import annotations

import ctypes
import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from pydantic import Field, model_validator

from chaoskit.errors import PreflightError
from chaoskit.model.types import StrictModel
from chaoskit.targets.kube import KubeNodeSelector
from chaoskit.targets.local import NetnsTarget

NETNS_RUN_DIR = Path("/run/netns")
CLONE_NEWNET = 0x40000000
T = TypeVar("T")


class NetTargetSpec(StrictModel):
    """Where a network fault lands: a namespace (name, PID, or a Kubernetes pod's) and optionally one interface."""

    netns: str | None = Field(None, min_length=1, description="network namespace name (ip netns) or a path "
                                                              "like /proc/PID/ns/net")
    pid: int | None = Field(None, gt=0, description="use the network namespace of this process")
    kubernetes: KubeNodeSelector | None = Field(None, description="the network namespace of chosen pods (each on its "
                                                                "node, through a helper pod)")
    interface: str | None = Field(None, min_length=1, description="interface inside the namespace; default: "
                                                                  "its only non-loopback interface")

    @model_validator(mode="after")
    def _one(self) -> NetTargetSpec:
        given = [k for k in ("netns", "pid", "kubernetes") if getattr(self, k) is not None]
        if len(given) > 1:
            raise ValueError(f"give one of netns, pid, kubernetes (got {' and '.join(given)})")
        return self

    def ns_path(self) -> str:
        if self.kubernetes is not None:  # never this host's: the helper pod on the pod's node localizes it first
            raise ValueError(f"{self.label()} is reached through a helper pod, not from this host")
        if self.pid is not None:
            return f"/proc/{self.pid}/ns/net"
        if self.netns is None:
            return "/proc/self/ns/net"
        return netns_path(self.netns)

    def label(self) -> str:
        if self.kubernetes is not None:
            return f"the network namespace of {self.kubernetes.describe()}"
        if self.pid is not None:
            return f"netns of PID {self.pid}"
        return f"netns {self.netns}" if self.netns else "the host namespace"


def netns_path(netns: str) -> str:
    """A namespace given by name (in /run/netns) or by path, as a path."""
    return netns if "/" in netns else str(NETNS_RUN_DIR / netns)


def ns_inode(path: str) -> int:
    return os.stat(path).st_ino


def same_namespace(record: dict[str, Any]) -> bool:
    """Is the namespace a revert record names still the one the fault went into? (False when it is gone:
    so is the fault.)"""
    try:
        return ns_inode(record["ns"]) == record["ns_inode"]
    except OSError:
        return False


def is_host_ns(path: str) -> bool:
    return ns_inode(path) == ns_inode("/proc/self/ns/net")


def run_in_netns(path: str, fn: Callable[[], T]) -> T:
    """Call fn in a fresh thread that has joined the network namespace at `path` (setns is per thread)."""
    box: dict[str, Any] = {}

    def body() -> None:
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            fd = os.open(path, os.O_RDONLY)
            try:
                if libc.setns(fd, CLONE_NEWNET) != 0:
                    err = ctypes.get_errno()
                    raise OSError(err, f"setns({path}): {os.strerror(err)}")
            finally:
                os.close(fd)
            box["value"] = fn()
        except BaseException as e:  # handed back to the caller's thread
            box["error"] = e

    t = threading.Thread(target=body, name="chaoskit-netns", daemon=True)
    t.start()
    t.join()
    if "error" in box:
        raise box["error"]
    return box["value"]


def with_iproute(path: str, fn: Callable[[Any], T]) -> T:
    """Call fn(ipr) with a pyroute2 IPRoute opened inside the namespace at `path`, on a fresh thread (so it
    works from inside a running asyncio loop too, where pyroute2's sync API cannot run)."""

    def body() -> T:
        from pyroute2 import IPRoute

        with IPRoute() as ipr:
            return fn(ipr)

    return run_in_netns(path, body)


def check_namespace(spec: NetTargetSpec, allow_host: bool, what: str) -> str:
    """The namespace path, after the blast-radius guard (PreflightError with a plain reason)."""
    path = spec.ns_path()
    if not os.path.exists(path):
        raise PreflightError(f"{what}: {spec.label()} does not exist ({path})")
    if is_host_ns(path) and not allow_host:
        raise PreflightError(f"{what}: the target is the host's root network namespace (its default-route "
                             "interface carries all traffic); give target.netns / target.pid of an isolated "
                             "namespace, or set allow_host: true")
    return path


def resolve(spec: NetTargetSpec, allow_host: bool, what: str) -> NetnsTarget:
    """Resolve namespace and interface, with the blast-radius guard."""
    path = check_namespace(spec, allow_host, what)
    try:
        links = with_iproute(path, lambda ipr: {ln.get_attr("IFLA_IFNAME"): ln["index"] for ln in ipr.get_links()})
    except OSError as e:
        raise PreflightError(f"{what}: cannot open {spec.label()}: {e}") from None
    if spec.interface is not None:
        if spec.interface not in links:
            raise PreflightError(f"{what}: no interface {spec.interface!r} in {spec.label()} "
                                 f"(has: {', '.join(sorted(links))})")
        ifname = spec.interface
    else:
        candidates = sorted(n for n in links if n != "lo")
        if len(candidates) != 1:
            raise PreflightError(f"{what}: {spec.label()} has {len(candidates)} non-loopback interfaces "
                                 f"({', '.join(candidates) or 'none'}); set target.interface")
        ifname = candidates[0]
    return NetnsTarget(path, ns_inode(path), spec.label(), ifname, links[ifname])


def resolve_namespace(spec: NetTargetSpec, allow_host: bool, what: str) -> NetnsTarget:
    """The namespace alone (for faults that need no interface), after the blast-radius guard."""
    path = check_namespace(spec, allow_host, what)
    return NetnsTarget(path, ns_inode(path), spec.label())
