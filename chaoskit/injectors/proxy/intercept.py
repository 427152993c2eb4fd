"""Transparent interception for the proxies: an nftables NAT redirect in the target's namespace sends a port's new
incoming TCP connections to the proxy running in that namespace, which forwards each to its original destination."""

from __future__ import annotations

import shutil
import subprocess
from typing import Any, Literal

from pydantic import Field, field_validator

from chaoskit.injectors.proxy import helper as proxy_proc
from chaoskit.model.types import Port, StrictModel
from chaoskit.targets import nftables
from chaoskit.targets.netns import NetTargetSpec, run_in_netns, same_namespace

FAMILY = "inet"  # IPv4 and IPv6: the proxy listens on both and reads each connection's original destination
OLD_FAMILY = "ip"  # IPv4 only: kernels before 5.2 (no NAT in inet tables), and chaoskit before 2026-12-05
PRIORITY = -100  # dstnat
TABLE_PATTERN = r"^chaoskit_[0-9a-f]{12}$"


class Intercept(StrictModel):
    port: Port = Field(description="the TCP port of the service in the namespace: its new incoming connections "
                                   "(IPv4 and IPv6) are redirected to the proxy, which forwards each to the "
                                   "address it was meant for")
    target: NetTargetSpec = Field(description="the network namespace the service listens in (netns name or path, "
                                              "or pid; or kubernetes: the chosen pods', each through a helper pod "
                                              "on its node); the proxy runs in it")
    existing: Literal["keep", "reset"] = Field("keep", description="connections to port already open at apply: "
                                               "keep (they go on straight to the service until they close: a "
                                               "client's keep-alive pool may never reach the proxy) or reset "
                                               "(destroyed once the redirect is in, RST to their clients, which "
                                               "reconnect through the proxy; a request in flight on one fails)")

    @field_validator("target")
    @classmethod
    def _not_the_host(cls, v: NetTargetSpec) -> NetTargetSpec:
        if v.netns is None and v.pid is None and v.kubernetes is None:
            raise ValueError("intercept needs target.netns, target.pid or target.kubernetes (not the host's own "
                             "namespace)")
        return v


def rules(table: str, port: int, to_port: int, family: str = FAMILY) -> list[dict[str, Any]]:
    """One table, one NAT prerouting chain, one rule: a SYN (only: a connection already open, even one conntrack
    first sees now, is never redirected mid-stream) to `port` goes to local `to_port`."""
    return [
        {"add": {"table": {"family": family, "name": table}}},
        {"add": {"chain": {"family": family, "table": table, "name": "intercept", "type": "nat",
                           "hook": "prerouting", "prio": PRIORITY, "policy": "accept"}}},
        {"add": {"rule": {"family": family, "table": table, "chain": "intercept", "expr": [
            {"match": {"op": "==", "left": {"payload": {"protocol": "tcp", "field": "dport"}}, "right": port}},
            {"match": {"op": "==", "left": {"&": [{"payload": {"protocol": "tcp", "field": "flags"}},
                                                  ["syn", "ack"]]}, "right": "syn"}},
            {"redirect": {"port": to_port}}]}}},
    ]


def free_port(ns: str) -> int:
    """A TCP port free on every address of the namespace now, IPv4 and IPv6 (the proxy listens on it there)."""

    def pick() -> int:
        with proxy_proc.listen("[::]:0") as s:  # the proxy's own socket, so free for the same families
            return int(s.getsockname()[1])

    return run_in_netns(ns, pick)


def add(ns: str, table: str, port: int, to_port: int) -> str:
    """Put the redirect in; its family: inet (IPv4 and IPv6), or ip (IPv4 only) on a kernel without NAT in inet
    tables (before Linux 5.2)."""
    try:
        nftables.run(ns, rules(table, port, to_port))
        return FAMILY
    except nftables.NftError:  # (the batch is atomic: nothing of it is in)
        nftables.run(ns, rules(table, port, to_port, OLD_FAMILY))
        return OLD_FAMILY


def _families(ns: str, table: str) -> list[str]:
    """The families the redirect's table is in (ours in FAMILY; one a chaoskit before IPv6 left in OLD_FAMILY)."""
    return [f for f in (FAMILY, OLD_FAMILY) if nftables.has_table(ns, f, table)]


def present(ns: str, ns_inode: int, table: str) -> bool:
    """Is the redirect still there (in the same namespace: one reused under that path is not ours)?"""
    return same_namespace({"ns": ns, "ns_inode": ns_inode}) and bool(_families(ns, table))


def remove(ns: str, ns_inode: int, table: str) -> None:
    """Delete the redirect's table (idempotent: gone, or the namespace gone, is done)."""
    if same_namespace({"ns": ns, "ns_inode": ns_inode}):
        _delete(ns, table)


def drop_own_table(table: str) -> None:
    """In the proxy's own namespace (it runs there): delete its redirect if it is still there (the proxy's
    lifetime ended before any revert)."""
    _delete("/proc/self/ns/net", table)


def _delete(ns: str, table: str) -> None:
    if families := _families(ns, table):
        nftables.run(ns, [{"delete": {"table": {"family": f, "name": table}}} for f in families])


def _addr(col: str) -> tuple[str, str]:
    """ss's `ADDRESS:PORT` column (IPv6 in brackets) as (address, port)."""
    host, _, port = col.rpartition(":")
    return host.strip("[]"), port


def _bracket(host: str) -> str:
    """An address as ss's filter takes it (IPv6 in brackets)."""
    return f"[{host}]" if ":" in host else host


def reset_open(ns: str, port: int) -> int:
    """Destroy (SOCK_DESTROY through `ss -K`: an RST to the peer) the established TCP connections to `port` in the
    namespace, but for the proxy's own ones to the service (from the namespace's own address); how many."""

    def go() -> int:
        ss = shutil.which("ss") or "ss"
        listed = subprocess.run([ss, "-tnH", "state", "established", f"( sport = :{port} )"], capture_output=True,
                                text=True, timeout=10, check=True).stdout
        done = 0
        for line in listed.splitlines():
            cols = line.split()
            if len(cols) < 4:
                continue
            (here, _), (peer, peer_port) = _addr(cols[2]), _addr(cols[3])
            if peer == here:
                continue
            subprocess.run([ss, "-K", "-tnH", "state", "established",
                            f"( sport = :{port} and dst {_bracket(peer)} and dport = :{peer_port} )"], capture_output=True,
                           timeout=10, check=True)
            done += 1
        return done

    return run_in_netns(ns, go)
