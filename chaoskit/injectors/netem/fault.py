"""network.netem and network.bandwidth: a root qdisc (netem / tbf) on an interface in a namespace, via pyroute2;
network.netem without sch_netem goes through an NFQUEUE helper instead (netem_queue)."""

from __future__ import annotations

import ipaddress
import os
import uuid
from typing import Any, ClassVar, Literal, TypeVar

from pydantic import Field, field_validator, model_validator

from chaoskit.errors import PreflightError
from chaoskit.injectors.base import NETNS_HELPER, NODE_EXECUTORS, Injector, NodeHelper, RevertRecord
from chaoskit.injectors.netem import nfqueue as netem_queue
from chaoskit.injectors.netem.dist import dist_file
from chaoskit.model.types import Duration, Percent, Port, StrictModel
from chaoskit.targets import tc
from chaoskit.targets.local import NetnsTarget
from chaoskit.targets.netns import NetTargetSpec, resolve, with_iproute
from chaoskit.units import format_size, parse_rate, parse_size

ROOT_HANDLE = 0x00CE0000  # "ce:" - chaoskit's root qdisc (or htb when a filter is given)
LEAF_HANDLE = 0x00CF0000  # "cf:" - the netem/tbf leaf under the htb class that matched traffic goes to
PASS_CLASS, FAULT_CLASS = ROOT_HANDLE | 1, ROOT_HANDLE | 2
PASS_RATE = 1_250_000_000  # 10 Gbit/s: the htb classes must not shape traffic themselves
ETH_P_IP, ETH_P_ALL = 0x0800, 0x0003


class TrafficFilter(StrictModel):
    """Affect only IPv4 packets to these destinations and/or destination ports (TCP/UDP); the rest pass untouched."""

    destinations: list[str] | None = Field(None, min_length=1, description="IPv4 addresses or CIDRs")
    ports: list[Port] | None = Field(None, min_length=1, description="destination ports")

    @field_validator("destinations")
    @classmethod
    def _nets(cls, v: list[str] | None) -> list[str] | None:
        for d in v or []:
            try:
                net = ipaddress.ip_network(d, strict=False)
            except ValueError:
                raise ValueError(f"{d!r} is not an IP address or CIDR") from None
            if net.version != 4:
                raise ValueError(f"{d}: only IPv4 destinations can be filtered for now")
        return v

    @model_validator(mode="after")
    def _some(self) -> TrafficFilter:
        if not self.destinations and not self.ports:
            raise ValueError("a filter needs destinations and/or ports (or leave filter out to affect everything)")
        return self

    def u32_keys(self) -> list[list[str]]:
        """One key list per (destination, port) pair; IPv4 header without options assumed (dport at offset 22)."""
        nets = [ipaddress.ip_network(d, strict=False) for d in self.destinations or []] or [None]
        ports = self.ports or [None]
        out = []
        for net in nets:
            for port in ports:
                keys = []
                if net is not None:
                    keys.append(f"0x{int(net.network_address):08x}/0x{int(net.netmask):08x}+16")
                if port is not None:
                    keys.append(f"0x{port:08x}/0x0000ffff+20")
                out.append(keys)
        return out


class _TcSpec(StrictModel):
    target: NetTargetSpec = Field(description="namespace (netns or pid) and interface")
    direction: Literal["egress", "ingress"] = Field("egress", description="ingress goes through an IFB device")
    filter: TrafficFilter | None = Field(None, description="affect only matching traffic")
    allow_host: bool = Field(False, description="allow the host's root namespace")


class NetemSpec(_TcSpec):
    type: Literal["network.netem"]
    delay: Duration = Field(0.0, description="added delay, e.g. 15ms")
    jitter: Duration = Field(0.0, description="delay variation (+/-)")
    correlation: Percent = Field(0.0, description="delay correlation with the previous packet")
    distribution: Literal["uniform", "normal", "pareto", "paretonormal"] = Field(
        "uniform", description="jitter distribution (tables from iproute2 for the non-uniform ones)")
    loss: Percent = Field(0.0, description="random loss, e.g. 0.2%")
    loss_correlation: Percent = Field(0.0, description="correlated loss (bursty)")
    duplicate: Percent = Field(0.0, description="duplicate packets")
    duplicate_correlation: Percent = 0.0
    corrupt: Percent = Field(0.0, description="flip a random bit")
    corrupt_correlation: Percent = 0.0
    reorder: Percent = Field(0.0, description="send this share immediately, the rest delayed (needs delay)")
    reorder_correlation: Percent = 0.0
    gap: int = Field(0, ge=0, description="reorder every Nth packet")
    rate: str | int | None = Field(None, description="netem's own rate limit, e.g. '10mbit'")
    limit: int = Field(1000, gt=0, description="queue length in packets")
    mode: Literal["auto", "qdisc", "queue"] = Field(
        "auto", description="qdisc: the sch_netem qdisc. queue: no sch_netem needed; an nft rule (in a chaoskit "
        "table of the namespace) sends the selected packets to an NFQUEUE, where a native helper holds each one "
        "until its time (CLOCK_MONOTONIC, SCHED_FIFO) and drops, duplicates (a marked copy sent through a raw "
        "socket), corrupts (one bit flipped after the IP header), reorders and rate-limits (IP length) them with "
        "netem's rules (but for correlation: a packet repeats the previous packet's draw with that chance, so "
        "the asked rates hold, where sch_netem's own correlation lowers them); on egress it holds a copy and frees the original at once, as sch_netem orphans it (else TCP "
        "Small Queues would hold a delayed sender to a few packets per delay); the queue's bypass flag lets "
        "packets pass whenever the helper is gone (it fails open); revert removes the rule, stops the helper "
        "(what it holds goes at once), deletes the table. auto: qdisc where the kernel has sch_netem, else queue "
        "(the plan and the journal say which and why)")

    @field_validator("rate")
    @classmethod
    def _rate(cls, v: str | int | None) -> str | int | None:
        if v is not None:
            parse_rate(v)
        return v

    @model_validator(mode="after")
    def _combos(self) -> NetemSpec:
        if not any((self.delay, self.loss, self.duplicate, self.corrupt, self.reorder, self.rate)):
            raise ValueError("netem needs at least one of delay, loss, duplicate, corrupt, reorder, rate")
        rules = [
            (self.jitter and not self.delay, "jitter needs delay"),
            (self.correlation and not self.jitter, "correlation (of delay) needs jitter"),
            (self.distribution != "uniform" and not self.jitter, "a distribution needs jitter"),
            (self.loss_correlation and not self.loss, "loss_correlation needs loss"),
            (self.duplicate_correlation and not self.duplicate, "duplicate_correlation needs duplicate"),
            (self.corrupt_correlation and not self.corrupt, "corrupt_correlation needs corrupt"),
            (self.reorder and not self.delay, "reorder needs delay (reordered packets skip the delay)"),
            ((self.gap or self.reorder_correlation) and not self.reorder, "gap/reorder_correlation need reorder"),
        ]
        for bad, msg in rules:
            if bad:
                raise ValueError(msg)
        return self

    def describe(self) -> str:
        parts = []
        if self.delay:
            parts.append(f"delay {self.delay * 1e3:g}ms" + (f" ±{self.jitter * 1e3:g}ms" if self.jitter else "")
                         + (f" {self.distribution}" if self.distribution != "uniform" else ""))
        for name in ("loss", "duplicate", "corrupt", "reorder"):
            if getattr(self, name):
                parts.append(f"{name} {getattr(self, name) * 100:g}%")
        if self.rate is not None:
            parts.append(f"rate {format_size(parse_rate(self.rate))}/s")
        return "netem " + ", ".join(parts)


class BandwidthSpec(_TcSpec):
    type: Literal["network.bandwidth"]
    rate: str | int = Field(description="e.g. '1mbit' or '512KiB/s'")
    burst: str | int = Field("32KiB", description="bucket size")
    latency: Duration = Field(0.05, description="the longest a packet may wait in the queue")

    @field_validator("rate")
    @classmethod
    def _rate(cls, v: str | int) -> str | int:
        parse_rate(v)
        return v

    @field_validator("burst")
    @classmethod
    def _burst(cls, v: str | int) -> str | int:
        if parse_size(v) < 1600:
            raise ValueError("burst must hold at least one MTU-sized packet (>= 1600 bytes)")
        return v

    def describe(self) -> str:
        return (f"tbf rate {self.rate} ({format_size(parse_rate(self.rate))}/s) burst {format_size(parse_size(self.burst))} "
                f"latency {self.latency * 1e3:g}ms")


# ---------------------------------------------------------------- the revert records


class QdiscOptions(RevertRecord):
    type: int = Field(ge=0)
    hex: str = Field(pattern=r"^(?:[0-9a-f]{2})*$")


class QdiscSnapshot(RevertRecord):
    """A root qdisc as tc.find snapshots it, which revert puts back byte-exactly."""

    ifindex: int | None = None  # of the interface it was on (revert puts it back on the record's ifindex)
    handle: int = Field(ge=0)
    parent: int
    kind: str
    options: QdiscOptions | None = None


class QdiscRecord(netem_queue.InterfaceRecord):
    """A qdisc fault's record (network.bandwidth; network.netem in qdisc mode): where, and on egress the root
    qdisc it replaced (None: the kernel's default), on ingress its IFB device, always one named ck<10 hex>
    (revert deletes the link of that name), and whether an ingress qdisc was there before."""

    mode: Literal["qdisc"] = "qdisc"  # network.netem's mode (network.bandwidth's is always qdisc)
    mode_reason: str = ""
    previous: QdiscSnapshot | None = None
    ifb: str | None = Field(None, pattern=r"^ck[0-9a-f]{10}$")
    had_ingress: bool = False

    @model_validator(mode="after")
    def _ingress_has_ifb(self) -> QdiscRecord:
        if self.direction == "ingress" and self.ifb is None:
            raise ValueError("an ingress record names its IFB device (ifb)")
        return self


NetemRecord = QdiscRecord | netem_queue.QueueRecord  # network.netem's, by its mode


# ---------------------------------------------------------------- the injectors

TcSpecT = TypeVar("TcSpecT", NetemSpec, BandwidthSpec)
TcRecordT = TypeVar("TcRecordT", bound=RevertRecord)


class _TcFault(Injector[TcSpecT, TcRecordT]):
    """Shared plan/prepare/apply/revert of a root qdisc: record the previous qdisc, install ours at the root,
    restore exactly (the verbs are the families', around these)."""

    executors: ClassVar[frozenset[str]] = NODE_EXECUTORS
    target_field: ClassVar[str | None] = "target.kubernetes"
    node_helper: ClassVar[NodeHelper] = NETNS_HELPER
    Record = QdiscRecord

    spec: TcSpecT

    def resolve_target(self) -> NetnsTarget:
        return resolve(self.spec.target, self.spec.allow_host, self.type)

    def _target(self) -> NetnsTarget:
        t = self.target_as(NetnsTarget)
        assert t.ifindex is not None  # a qdisc fault's target always names its interface
        return t

    def _add_leaf(self, ipr: Any, ifindex: int, parent: int, handle: int) -> None:
        raise NotImplementedError

    def preflight(self) -> None:
        t = self._target()
        if self.spec.direction == "ingress" and tc.find(t.ns_path, t.ifindex, tc.TC_H_INGRESS):
            raise PreflightError(f"{self.type}: {t.describe()} already has an ingress qdisc; chaoskit will not "
                                 "replace it (it could not restore its filters exactly)")
        if self.spec.direction == "egress":
            prev = tc.find(t.ns_path, t.ifindex, tc.TC_H_ROOT)
            if prev and not tc.is_default(prev) and prev["kind"] in ("htb", "hfsc", "drr", "qfq", "ets", "prio",
                                                                        "cbq", "multiq", "mqprio", "taprio"):
                raise PreflightError(f"{self.type}: {t.describe()} has a classful {prev['kind']} tree at the root; "
                                     "replacing it would lose its classes and filters")
            if prev and prev["handle"] == ROOT_HANDLE:
                raise PreflightError(f"{self.type}: {t.describe()} already carries a chaoskit qdisc (another run, or "
                                     "a leftover: `chaoskit rollback --all`)")
        if self.spec.filter and self.spec.filter.destinations:
            self._check_routes(t)

    def _check_routes(self, t: NetnsTarget) -> None:
        """Refuse a filter that matches nothing: each destination must leave through the target interface."""
        if self.spec.direction != "egress":
            return

        def oifs(ipr: Any, addr: str) -> set[int]:
            try:
                return {r.get_attr("RTA_OIF") for r in ipr.route("get", dst=addr)}
            except Exception:
                return set()

        for d in self.spec.filter.destinations or []:
            addr = str(ipaddress.ip_network(d, strict=False).network_address)
            if t.ifindex not in with_iproute(t.ns_path, lambda ipr, a=addr: oifs(ipr, a)):
                raise PreflightError(f"{self.type}: filter destination {d} is not routed through {t.describe()}; "
                                     "the filter would match nothing")

    def plan(self) -> list[str]:
        t = self._target()
        where = t.describe()
        if self.spec.direction == "ingress":
            where = f"an IFB device receiving {t.ifname}'s ingress (redirected by a u32/mirred filter) in {t.label}"
        lines = [f"install {self.spec.describe()} as the root qdisc of {where}"]
        if self.spec.filter:
            lines[0] = (f"install htb at the root of {where}: matching traffic -> {self.spec.describe()}, "
                        f"the rest passes (10 Gbit/s class)")
            lines.append(f"match: {', '.join(' '.join(k) for k in self.spec.filter.u32_keys())}")
        lines.append("revert: the previous root qdisc is restored byte-exactly"
                     if self.spec.direction == "egress" else "revert: ingress qdisc and IFB device deleted")
        return lines

    def prepare_qdisc(self, **more: Any) -> QdiscRecord:
        """The record of a qdisc fault (`more`: network.netem's mode and why)."""
        t = self._target()
        assert t.ifindex is not None and t.ifname is not None
        where = {"ns": t.ns_path, "ns_inode": t.ns_inode, "ifindex": t.ifindex, "ifname": t.ifname, **more}
        if self.spec.direction == "ingress":
            return QdiscRecord(**where, direction="ingress", ifb=f"ck{uuid.uuid4().hex[:10]}",
                               had_ingress=tc.find(t.ns_path, t.ifindex, tc.TC_H_INGRESS) is not None)
        previous = tc.find(t.ns_path, t.ifindex, tc.TC_H_ROOT)
        return QdiscRecord(**where, direction="egress",
                           previous=None if previous is None else QdiscSnapshot.model_validate(previous))

    def apply_qdisc(self, record: QdiscRecord) -> QdiscRecord:
        with_iproute(record.ns, lambda ipr: self._install(ipr, record))
        return record

    def _install(self, ipr: Any, record: QdiscRecord) -> None:
        index = record.ifindex
        if record.direction == "ingress":
            if record.had_ingress:
                raise RuntimeError(f"{record.ifname} already has an ingress qdisc that is not chaoskit's; "
                                   "refusing to replace it")
            ipr.link("add", ifname=record.ifb, kind="ifb")
            index = ipr.link_lookup(ifname=record.ifb)[0]
            ipr.link("set", index=index, state="up")
            ipr.tc("add", "ingress", record.ifindex)
            ipr.tc("add-filter", "u32", record.ifindex, parent=0xFFFF0000, prio=1, protocol=ETH_P_ALL,
                   target=0x10000, keys=["0x0/0x0+0"],
                   action={"kind": "mirred", "direction": "egress", "action": "redirect", "ifindex": index})
        if self.spec.filter is None:
            self._add_leaf(ipr, index, tc.TC_H_ROOT, ROOT_HANDLE)
        else:
            ipr.tc("replace", "htb", index, handle=ROOT_HANDLE, parent=tc.TC_H_ROOT, default=PASS_CLASS & 0xFFFF)
            for cls in (PASS_CLASS, FAULT_CLASS):
                ipr.tc("add-class", "htb", index, handle=cls, parent=ROOT_HANDLE, rate=PASS_RATE, ceil=PASS_RATE)
            self._add_leaf(ipr, index, FAULT_CLASS, LEAF_HANDLE)
            for keys in self.spec.filter.u32_keys():
                ipr.tc("add-filter", "u32", index, parent=ROOT_HANDLE, prio=1, protocol=ETH_P_IP,
                       target=FAULT_CLASS, keys=keys)

    @staticmethod
    def revert_qdisc(r: QdiscRecord) -> None:
        if not r.same_namespace():
            return
        if r.direction == "ingress":
            # ours only if our IFB exists (apply creates it before the ingress qdisc) and none was there before
            if _ifb_exists(r) and not r.had_ingress:
                tc.delete(r.ns, r.ifindex, tc.TC_H_INGRESS)
            with_iproute(r.ns, lambda ipr: [ipr.link("del", index=i) for i in ipr.link_lookup(ifname=r.ifb)])
            return
        current = tc.find(r.ns, r.ifindex, tc.TC_H_ROOT)
        if current is None or current["handle"] != ROOT_HANDLE:
            return  # ours is not there (never applied, or already reverted)
        if r.previous is None or tc.is_default(r.previous.to_json()):
            tc.delete(r.ns, r.ifindex, tc.TC_H_ROOT)
        else:
            tc.restore(r.ns, r.ifindex, r.previous.to_json())

    @classmethod
    def holds(cls, record: NetemRecord) -> list[str]:
        return netem_queue.holds(record) if isinstance(record, netem_queue.QueueRecord) else qdisc_holds(record)

    @staticmethod
    def observe_qdisc(r: QdiscRecord) -> bool:
        if not r.same_namespace():
            return False
        if r.direction == "ingress":
            return _ifb_exists(r) and tc.find(r.ns, r.ifindex, tc.TC_H_INGRESS) is not None
        current = tc.find(r.ns, r.ifindex, tc.TC_H_ROOT)
        return current is not None and current["handle"] == ROOT_HANDLE


def qdisc_holds(r: QdiscRecord) -> list[str]:
    """What a qdisc fault holds, in words (`chaoskit status`): the qdiscs and IFB device, where, and the command
    that shows each."""
    show = f"nsenter --net={r.ns} tc qdisc show dev"
    if r.direction == "ingress":
        return [f"ingress qdisc on {r.ifname} in netns {r.ns}, redirecting its packets to IFB device {r.ifb}; "
                f"see it: {show} {r.ifname}",
                f"IFB device {r.ifb} in netns {r.ns}, chaoskit's root qdisc ce: on it; see it: {show} {r.ifb}"]
    replaced = ("" if r.previous is None or tc.is_default(r.previous.to_json())
                else f", in place of a {r.previous.kind} qdisc (put back on revert)")
    return [f"root qdisc ce: on {r.ifname} ({r.direction}) in netns {r.ns}{replaced}; see it: {show} {r.ifname}"]


def _ifb_exists(r: QdiscRecord) -> bool:
    return bool(with_iproute(r.ns, lambda ipr: ipr.link_lookup(ifname=r.ifb)))


def netem_mode(asked: str) -> tuple[str, str]:
    """(qdisc or queue, why) for network.netem's `mode`: auto tries a netem qdisc in a throwaway namespace."""
    if asked != "auto":
        return asked, f"mode: {asked} asked"
    reason = tc.netem_missing_reason()
    if reason is None:
        return "qdisc", "auto: this kernel has sch_netem"
    return "queue", f"auto: {reason.split(' (')[0]}"


class Netem(_TcFault[NetemSpec, NetemRecord]):
    type: ClassVar[str] = "network.netem"
    host_needs: ClassVar[frozenset[str]] = frozenset({"root", "netem"})
    # on a pod, queue mode's helper sends its held copies (egress) and duplicates through a raw socket: NET_RAW
    node_helper: ClassVar[NodeHelper] = NodeHelper(capabilities=("NET_ADMIN", "NET_RAW", "SYS_ADMIN", "SYS_PTRACE"))
    summary: ClassVar[str] = ("delay, jitter, loss, duplicate, corrupt, reorder, rate with netem (pyroute2 netlink), "
                              "or without sch_netem through an NFQUEUE helper (mode: queue)")
    Spec = NetemSpec
    spec: NetemSpec
    _mode: tuple[str, str] | None = None

    def mode(self) -> tuple[str, str]:
        """(qdisc or queue, why), decided once per fault."""
        if self._mode is None:
            self._mode = netem_mode(self.spec.mode)
        return self._mode

    def preflight(self) -> None:
        if os.geteuid() != 0:
            raise PreflightError("network.netem needs root (CAP_NET_ADMIN)")
        mode, _ = self.mode()
        if mode == "qdisc":
            reason = tc.netem_missing_reason()
            if reason:
                raise PreflightError(f"network.netem: {reason}; mode: queue (or auto) works without it, "
                                     "network.proxy adds latency without it")
        if self.spec.distribution != "uniform":
            dist_file(self.spec.distribution)
        if mode == "queue":
            self._preflight_queue()
        else:
            super().preflight()

    def _preflight_queue(self) -> None:
        t = self._target()
        netem_queue.preflight(t)
        if self.spec.filter and self.spec.filter.destinations:
            self._check_routes(t)

    def plan(self) -> list[str]:
        mode, why = self.mode()
        if mode == "queue":
            return netem_queue.plan(self.spec, self._target(), why)
        return [f"mode qdisc ({why})", *super().plan()]

    def prepare(self) -> NetemRecord:
        mode, why = self.mode()
        if mode == "queue":
            return netem_queue.prepare(self._target(), self.spec.direction, why)
        return self.prepare_qdisc(mode="qdisc", mode_reason=why)

    def apply(self, record: NetemRecord) -> NetemRecord:
        if isinstance(record, netem_queue.QueueRecord):
            dist = str(dist_file(self.spec.distribution)) if self.spec.distribution != "uniform" else None
            return netem_queue.apply(self.spec, record, dist, self.ctx.lifetime_s)
        return self.apply_qdisc(record)

    @classmethod
    def read_record(cls, record: dict[str, Any]) -> NetemRecord:
        """A QdiscRecord, or in queue mode a netem_queue.QueueRecord (RecordError naming each wrong field)."""
        queue = isinstance(record, dict) and record.get("mode") == "queue"
        model = netem_queue.QueueRecord if queue else QdiscRecord
        return cls.read_record_as(model, record)

    @classmethod
    def revert(cls, record: NetemRecord) -> None:
        if isinstance(record, netem_queue.QueueRecord):
            netem_queue.revert(record)
        else:
            cls.revert_qdisc(record)

    @classmethod
    def observe(cls, record: NetemRecord) -> bool:
        if isinstance(record, netem_queue.QueueRecord):
            return netem_queue.observe(record)
        return cls.observe_qdisc(record)

    @classmethod
    def observe_details(cls, record: NetemRecord) -> dict[str, Any]:
        details: dict[str, Any] = {"in_effect": cls.observe(record), "mode": record.mode}
        if isinstance(record, netem_queue.QueueRecord):
            counters = netem_queue.stats(record)
            details["helper"] = counters.to_json() if counters is not None else None
        return details

    def _add_leaf(self, ipr: Any, ifindex: int, parent: int, handle: int) -> None:
        from chaoskit.injectors.netem import netlink  # pyroute2: imported where a netem qdisc is made

        tc.replace(ipr, netlink.netem_message(self.spec, ifindex, parent, handle))


class Bandwidth(_TcFault[BandwidthSpec, QdiscRecord]):
    type: ClassVar[str] = "network.bandwidth"
    host_needs: ClassVar[frozenset[str]] = frozenset({"root"})
    summary: ClassVar[str] = "limit throughput with a token bucket (tbf)"
    Spec = BandwidthSpec
    spec: BandwidthSpec

    def preflight(self) -> None:
        if os.geteuid() != 0:
            raise PreflightError("network.bandwidth needs root (CAP_NET_ADMIN)")
        super().preflight()

    def prepare(self) -> QdiscRecord:
        return self.prepare_qdisc()

    def apply(self, record: QdiscRecord) -> QdiscRecord:
        return self.apply_qdisc(record)

    @classmethod
    def revert(cls, record: QdiscRecord) -> None:
        cls.revert_qdisc(record)

    @classmethod
    def observe(cls, record: QdiscRecord) -> bool:
        return cls.observe_qdisc(record)

    def _add_leaf(self, ipr: Any, ifindex: int, parent: int, handle: int) -> None:
        ipr.tc("replace", "tbf", ifindex, handle=handle, parent=parent, rate=parse_rate(self.spec.rate),
               burst=parse_size(self.spec.burst), latency=round(self.spec.latency * 1e6))
