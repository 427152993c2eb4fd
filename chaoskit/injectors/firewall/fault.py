"""network.drop and network.partition: nftables rules in a dedicated table of the target namespace."""

from __future__ import annotations

import ipaddress
import os
import uuid
from typing import Any, ClassVar, Literal

from pydantic import Field, field_validator, model_validator

from chaoskit.errors import PreflightError
from chaoskit.injectors.base import NETNS_HELPER, NODE_EXECUTORS, Injector, NodeHelper, RevertRecord
from chaoskit.model.types import Percent, Port, StrictModel
from chaoskit.targets import nftables
from chaoskit.targets.local import NetnsTarget
from chaoskit.targets.netns import NetTargetSpec, resolve_namespace, same_namespace

FAMILY = "inet"
PRIORITY = -10  # before the usual filter chains (priority 0)


def _addr(value: str) -> Any:
    net = ipaddress.ip_network(value, strict=False)
    if net.num_addresses == 1:
        return str(net.network_address)
    return {"prefix": {"addr": str(net.network_address), "len": net.prefixlen}}


def _delete(table: str) -> dict[str, Any]:
    return {"delete": {"table": {"family": FAMILY, "name": table}}}


class _FirewallSpec(StrictModel):
    target: NetTargetSpec = Field(description="namespace (netns or pid); rules apply to all its interfaces")
    peers: list[str] | None = Field(None, min_length=1, description="addresses/CIDRs on the other side")
    ports: list[Port] | None = Field(None, min_length=1, description="service ports (matched as source or "
                                                                   "destination port, TCP and UDP)")
    direction: Literal["input", "output", "both"] = Field("both", description="which packets of the namespace")
    allow_host: bool = Field(False, description="allow the host's root namespace")

    @field_validator("peers")
    @classmethod
    def _peers(cls, v: list[str] | None) -> list[str] | None:
        for p in v or []:
            try:
                ipaddress.ip_network(p, strict=False)
            except ValueError:
                raise ValueError(f"{p!r} is not an IP address or CIDR") from None
        return v

    def share(self) -> float:
        """Fraction of matching packets dropped."""
        raise NotImplementedError

    def rules(self, table: str) -> list[dict[str, Any]]:
        """The nft JSON commands: one table, a chain per hook, one rule per (chain, family, port role)."""
        cmds: list[dict[str, Any]] = [{"add": {"table": {"family": FAMILY, "name": table}}}]
        hooks = ["input", "output"] if self.direction == "both" else [self.direction]
        for hook in hooks:
            cmds.append({"add": {"chain": {"family": FAMILY, "table": table, "name": hook, "type": "filter",
                                           "hook": hook, "prio": PRIORITY, "policy": "accept"}}})
            peer_field = "saddr" if hook == "input" else "daddr"
            by_version: dict[int, list[Any]] = {}
            for p in self.peers or []:
                by_version.setdefault(ipaddress.ip_network(p, strict=False).version, []).append(_addr(p))
            peer_matches: list[list[dict[str, Any]]] = [
                [{"match": {"op": "==", "left": {"payload": {"protocol": "ip" if v == 4 else "ip6",
                                                              "field": peer_field}},
                            "right": {"set": addrs}}}]
                for v, addrs in sorted(by_version.items())
            ] or [[]]
            port_matches: list[list[dict[str, Any]]] = [[]]
            if self.ports:
                l4 = {"match": {"op": "==", "left": {"meta": {"key": "l4proto"}}, "right": {"set": ["tcp", "udp"]}}}
                port_matches = [[l4, {"match": {"op": "==", "left": {"payload": {"protocol": "th", "field": f}},
                                                "right": {"set": list(self.ports)}}}] for f in ("dport", "sport")]
            chance: list[dict[str, Any]] = []
            if self.share() < 1.0:
                chance = [{"match": {"op": "<", "left": {"numgen": {"mode": "random", "mod": 10000}},
                                     "right": round(self.share() * 10000)}}]
            for pm in peer_matches:
                for po in port_matches:
                    cmds.append({"add": {"rule": {"family": FAMILY, "table": table, "chain": hook,
                                                  "expr": [*po, *pm, *chance, {"counter": None}, {"drop": None}]}}})
        return cmds

    def describe(self) -> str:
        what = []
        if self.peers:
            what.append(f"peers {', '.join(self.peers)}")
        if self.ports:
            what.append(f"ports {', '.join(map(str, self.ports))}")
        scope = " and ".join(what) or "all traffic"
        way = "input and output" if self.direction == "both" else self.direction
        return f"drop {self.share() * 100:g}% of {way} packets ({scope})"


class DropSpec(_FirewallSpec):
    type: Literal["network.drop"]
    percent: Percent = Field(description="share of matching packets dropped at random (nft numgen), e.g. 50%")

    @field_validator("percent")
    @classmethod
    def _positive(cls, v: float) -> float:
        if v <= 0:
            raise ValueError("percent must be above 0%")
        return v

    def share(self) -> float:
        return self.percent


class PartitionSpec(_FirewallSpec):
    type: Literal["network.partition"]

    @model_validator(mode="after")
    def _scoped(self) -> PartitionSpec:
        if not self.peers and not self.ports:
            raise ValueError("a partition needs peers and/or ports (to cut everything, use network.drop percent: 100%)")
        return self

    def share(self) -> float:
        return 1.0


class NftRecord(RevertRecord):
    """A firewall fault's record: the namespace (its path and inode: a namespace reused under that path is not
    touched) and the table, which is always one of chaoskit's own, whatever the ledger says."""

    ns: str
    ns_inode: int
    table: str = Field(pattern=r"^chaoskit_[0-9a-f]{12}$")

    def same_namespace(self) -> bool:
        return same_namespace({"ns": self.ns, "ns_inode": self.ns_inode})


class _Firewall(Injector[DropSpec | PartitionSpec, NftRecord]):
    independent_revert: ClassVar[bool] = True
    Record = NftRecord
    executors: ClassVar[frozenset[str]] = NODE_EXECUTORS
    target_field: ClassVar[str | None] = "target.kubernetes"
    node_helper: ClassVar[NodeHelper] = NETNS_HELPER
    spec: DropSpec | PartitionSpec

    def resolve_target(self) -> NetnsTarget:
        return resolve_namespace(self.spec.target, self.spec.allow_host, self.type)

    def preflight(self) -> None:
        if os.geteuid() != 0:
            raise PreflightError(f"{self.type} needs root (CAP_NET_ADMIN)")
        t = self.target_as(NetnsTarget)
        try:
            nftables.tables(t.ns_path)
        except (nftables.NftError, OSError) as e:
            raise PreflightError(f"{self.type}: nftables unusable in {t.label}: {e}") from None

    def plan(self) -> list[str]:
        return [f"in {self.spec.target.label()}: nft table {FAMILY} chaoskit_<id> that will "
                f"{self.spec.describe()}; revert deletes the table whole"]

    def prepare(self) -> NftRecord:
        t = self.target_as(NetnsTarget)
        return NftRecord(ns=t.ns_path, ns_inode=t.ns_inode, table=f"chaoskit_{uuid.uuid4().hex[:12]}")

    def apply(self, record: NftRecord) -> NftRecord:
        nftables.run(record.ns, self.spec.rules(record.table))
        return record

    @classmethod
    def revert(cls, record: NftRecord) -> None:
        r = record
        if r.same_namespace() and nftables.has_table(r.ns, FAMILY, r.table):
            nftables.run(r.ns, [_delete(r.table)])

    @classmethod
    def revert_many(cls, records: list[NftRecord]) -> None:
        """Delete the tables of many faults, one nft transaction per namespace: a transaction costs ~15-40 ms
        however many tables it deletes, and concurrent ones barely overlap. A speed-up only: a failed
        transaction (a table gone meanwhile) deletes nothing, and each fault's own revert still follows."""
        by_ns: dict[str, list[str]] = {}
        for r in records:
            if r.same_namespace():
                by_ns.setdefault(r.ns, []).append(r.table)
        for ns, names in by_ns.items():
            present = nftables.table_names(ns, FAMILY)
            if doomed := [_delete(name) for name in names if name in present]:
                nftables.run(ns, doomed)

    @classmethod
    def observe(cls, record: NftRecord) -> bool:
        r = record
        return r.same_namespace() and nftables.has_table(r.ns, FAMILY, r.table)

    @classmethod
    def holds(cls, record: NftRecord) -> list[str]:
        t, ns = record.table, record.ns
        return [f"nft table {FAMILY} {t} in netns {ns}; see it: nsenter --net={ns} nft list table {FAMILY} {t}"]


class Drop(_Firewall):
    type: ClassVar[str] = "network.drop"
    host_needs: ClassVar[frozenset[str]] = frozenset({"root", "nftables"})
    summary: ClassVar[str] = "drop a share of packets (nftables numgen random) in a namespace"
    Spec = DropSpec
    spec: DropSpec


class Partition(_Firewall):
    type: ClassVar[str] = "network.partition"
    host_needs: ClassVar[frozenset[str]] = frozenset({"root", "nftables"})
    summary: ClassVar[str] = "blackhole traffic to/from peers or ports (nftables) in a namespace"
    Spec = PartitionSpec
    spec: PartitionSpec
