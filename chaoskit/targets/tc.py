"""Snapshot, restore and delete root/ingress qdiscs byte-exactly, with pyroute2's tcmsg (imported where a message is
made: pyroute2 costs ~0.08 s, and every chaoskit process loads the fault family that imports this module)."""

from __future__ import annotations

import errno
import os
import socket
import uuid
from functools import cache
from typing import Any

from chaoskit.targets.netns import with_iproute

__all__ = ["TC_H_INGRESS", "TC_H_ROOT", "delete", "find", "is_default", "netem_missing_reason", "qdisc_message",
           "qdisc_message_class", "qdiscs", "replace", "request", "restore", "restore_message", "snapshot"]

TC_H_ROOT = 0xFFFFFFFF  # the kernel's (linux/pkt_sched.h), as pyroute2.netlink.rtnl has them
TC_H_INGRESS = 0xFFFFFFF1
TCA_OPTIONS = 2  # the attribute type a snapshot records, with the flag bits the kernel dumped it with
INGRESS_HANDLE = 0xFFFF0000


@cache
def qdisc_message_class() -> type[Any]:
    """pyroute2's tcmsg, except that TCA_OPTIONS stays the kernel's own bytes both ways (pyroute2's `cdata` NLA):
    a snapshot keeps what the kernel dumped and a restore sends exactly that back. Decoding the options with
    pyroute2's per-kind classes and encoding them again is not byte-exact: they know only part of each qdisc's
    attributes, and drop the rest on encode (tbf's TCA_TBF_RATE64, dumped for rates of 2^32 bytes/s and up).
    pyroute2 caches the compiled attribute table on the class (name-mangled attributes of nlmsg_base); reset
    them so this subclass compiles its own instead of inheriting tcmsg's."""
    from pyroute2.netlink.rtnl.tcmsg import tcmsg

    class QdiscMessage(tcmsg):
        _nlmsg_base__compiled_nla = False
        _nlmsg_base__t_nla_map = None
        _nlmsg_base__r_nla_map = None
        nla_map = tuple((name, "cdata") if name == "TCA_OPTIONS" else (name, t) for name, t in tcmsg.nla_map)

    return QdiscMessage


def qdisc_message(ifindex: int, handle: int = 0, parent: int = 0) -> Any:
    msg = qdisc_message_class()()
    msg["family"], msg["info"] = socket.AF_UNSPEC, 0
    msg["index"], msg["handle"], msg["parent"] = ifindex, handle, parent
    return msg


def request(ipr: Any, msg: Any, msg_type: int, flags: int) -> list[Any]:
    """Send one tcmsg on an open pyroute2 IPRoute; the answers (OSError on a NACK, as the kernel's errno).
    Not IPRoute.nlm_request: the sync IPRoute of pyroute2 0.9.3 to 0.9.7 raises KeyError('nlm_generator') first;
    nlm_request_batch, with type and flags in the message header, is the sync path that works."""
    from pyroute2.netlink.exceptions import NetlinkError

    msg["header"]["type"], msg["header"]["flags"] = msg_type, flags
    try:
        return list(ipr.nlm_request_batch([msg]))
    except NetlinkError as e:
        raise OSError(e.code, f"rtnetlink: {os.strerror(e.code)}") from None


def snapshot(msg: Any) -> dict[str, Any]:
    """A dumped qdisc as the ledger stores it: ifindex, handle, parent, kind, raw options (attribute type, hex)."""
    opts = next((a for a in msg["attrs"] if a.name == "TCA_OPTIONS"), None)  # pyroute2 nla_slot
    raw = None if opts is None else {"type": TCA_OPTIONS | opts.get_flags(), "hex": opts.get_value().hex()}
    return {"ifindex": msg["index"], "handle": msg["handle"], "parent": msg["parent"],
            "kind": msg.get_attr("TCA_KIND") or "", "options": raw}


def qdiscs(ns_path: str, ifindex: int = 0) -> list[dict[str, Any]]:
    """Every qdisc of the namespace (or of one interface): ifindex, handle, parent, kind, raw options."""

    from pyroute2.netlink import NLM_F_DUMP, NLM_F_REQUEST
    from pyroute2.netlink.rtnl import RTM_GETQDISC, RTM_NEWQDISC

    def dump(ipr: Any) -> list[dict[str, Any]]:
        ipr.register_policy(RTM_NEWQDISC, qdisc_message_class())  # this socket's parser only
        return [snapshot(m) for m in request(ipr, qdisc_message(ifindex), RTM_GETQDISC, NLM_F_REQUEST | NLM_F_DUMP)]

    return [q for q in with_iproute(ns_path, dump) if not ifindex or q["ifindex"] == ifindex]


def find(ns_path: str, ifindex: int, parent: int) -> dict[str, Any] | None:
    return next((q for q in qdiscs(ns_path, ifindex) if q["parent"] == parent), None)


def delete(ns_path: str, ifindex: int, parent: int) -> bool:
    """Delete the qdisc at `parent` (TC_H_ROOT or TC_H_INGRESS). False if there was none to delete."""
    from pyroute2.netlink import NLM_F_ACK, NLM_F_REQUEST
    from pyroute2.netlink.rtnl import RTM_DELQDISC

    msg = qdisc_message(ifindex, INGRESS_HANDLE if parent == TC_H_INGRESS else 0, parent)
    try:
        with_iproute(ns_path, lambda ipr: request(ipr, msg, RTM_DELQDISC, NLM_F_REQUEST | NLM_F_ACK))
    except OSError as e:
        if e.errno in (errno.ENOENT, errno.EINVAL, errno.ENODEV):  # none / only the default is left / link gone
            return False
        raise
    return True


def restore_message(ifindex: int, snap: dict[str, Any]) -> Any:
    """The RTM_NEWQDISC that puts a snapshotted qdisc back: kind, handle, parent and the option bytes as dumped."""
    from pyroute2.netlink import NLA_F_NESTED, NLA_F_NET_BYTEORDER

    msg = qdisc_message(ifindex, snap["handle"], snap["parent"])
    msg["attrs"] = [["TCA_KIND", snap["kind"]]]
    if snap.get("options") is not None:
        flags = snap["options"]["type"] & (NLA_F_NESTED | NLA_F_NET_BYTEORDER)  # a tuple's 3rd item: NLA flags
        msg["attrs"].append(("TCA_OPTIONS", bytes.fromhex(snap["options"]["hex"]), flags))
    return msg


def restore(ns_path: str, ifindex: int, snap: dict[str, Any]) -> None:
    """Put back a qdisc exactly as snapshotted (kind, handle, parent, option bytes)."""
    msg = restore_message(ifindex, snap)
    with_iproute(ns_path, lambda ipr: replace(ipr, msg))


def replace(ipr: Any, msg: Any) -> None:
    """Add the qdisc of an RTM_NEWQDISC message, or replace the one at its parent, on an open IPRoute."""
    from pyroute2.netlink import NLM_F_ACK, NLM_F_CREATE, NLM_F_REPLACE, NLM_F_REQUEST
    from pyroute2.netlink.rtnl import RTM_NEWQDISC

    request(ipr, msg, RTM_NEWQDISC, NLM_F_REQUEST | NLM_F_ACK | NLM_F_CREATE | NLM_F_REPLACE)


def is_default(snap: dict[str, Any] | None) -> bool:
    """A kernel-default qdisc (noqueue, pfifo_fast, mq, fq_codel by sysctl) has handle 0: deleting ours restores it."""
    return snap is None or snap["handle"] == 0


def netem_missing_reason() -> str | None:
    """None when this kernel accepts a netem qdisc (tried on lo of a throwaway namespace), else why not."""
    from pyroute2 import netns

    def try_netem(ipr: Any) -> None:
        idx = ipr.link_lookup(ifname="lo")[0]
        ipr.link("set", index=idx, state="up")
        ipr.tc("add", "netem", idx, delay=1000)

    name = f"chaoskit-probe-{uuid.uuid4().hex[:8]}"
    try:
        netns.create(name)
        with_iproute(f"/run/netns/{name}", try_netem)
        return None
    except Exception as e:
        if getattr(e, "code", None) == errno.ENOENT:
            return "this kernel has no sch_netem (modprobe sch_netem; it is built in on most distro kernels)"
        return f"netem qdisc refused: {e}"
    finally:
        try:
            netns.remove(name)
        except Exception:
            pass
