"""Snapshot, restore and delete root/ingress qdiscs byte-exactly over a raw rtnetlink socket."""

from __future__ import annotations

import errno
import os
import socket
import struct
import uuid
from typing import Any

from chaoskit.targets.netns import run_in_netns, with_iproute

NETLINK_ROUTE = 0
NLMSG_ERROR, NLMSG_DONE = 2, 3
RTM_NEWQDISC, RTM_DELQDISC, RTM_GETQDISC = 36, 37, 38
F_REQUEST, F_ACK, F_REPLACE, F_EXCL, F_CREATE, F_DUMP = 0x1, 0x4, 0x100, 0x200, 0x400, 0x300
TCA_KIND, TCA_OPTIONS = 1, 2
TC_H_ROOT, TC_H_INGRESS = 0xFFFFFFFF, 0xFFFFFFF1
_TCMSG = struct.Struct("=BxxxiIII")
_NLMSG = struct.Struct("=IHHII")
_RTA = struct.Struct("=HH")


def _align(n: int) -> int:
    return (n + 3) & ~3


def _attr(kind: int, data: bytes) -> bytes:
    return _RTA.pack(_RTA.size + len(data), kind) + data + b"\0" * (_align(len(data)) - len(data))


def _talk(msg_type: int, flags: int, body: bytes) -> list[bytes]:
    """Send one request in the current namespace; return the payloads of the answers (raise OSError on NACK)."""
    with socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_ROUTE) as s:
        s.bind((0, 0))
        s.send(_NLMSG.pack(_NLMSG.size + len(body), msg_type, flags, 1, 0) + body)
        out: list[bytes] = []
        while True:
            data = s.recv(1 << 16)
            off = 0
            while off + _NLMSG.size <= len(data):
                length, kind, _flags, _seq, _pid = _NLMSG.unpack_from(data, off)
                payload = data[off + _NLMSG.size: off + length]
                off += _align(length)
                if kind == NLMSG_DONE:
                    return out
                if kind == NLMSG_ERROR:
                    err = struct.unpack_from("=i", payload)[0]
                    if err:
                        raise OSError(-err, f"rtnetlink: {os.strerror(-err)}")
                    return out
                out.append(payload)
            if not flags & F_DUMP and not flags & F_ACK:
                return out


def _parse_qdisc(payload: bytes) -> dict[str, Any]:
    _family, ifindex, handle, parent, _info = _TCMSG.unpack_from(payload)
    q: dict[str, Any] = {"ifindex": ifindex, "handle": handle, "parent": parent, "kind": "", "options": None}
    off = _TCMSG.size
    while off + _RTA.size <= len(payload):
        length, kind = _RTA.unpack_from(payload, off)
        if length < _RTA.size:
            break
        data = payload[off + _RTA.size: off + length]
        if kind == TCA_KIND:
            q["kind"] = data.rstrip(b"\0").decode()
        elif kind & 0x3FFF == TCA_OPTIONS:
            q["options"] = {"type": kind, "hex": data.hex()}
        off += _align(length)
    return q


def qdiscs(ns_path: str, ifindex: int = 0) -> list[dict[str, Any]]:
    """Every qdisc of the namespace (or of one interface): ifindex, handle, parent, kind, raw options."""
    body = _TCMSG.pack(0, ifindex, 0, 0, 0)
    rows = run_in_netns(ns_path, lambda: [_parse_qdisc(p) for p in _talk(RTM_GETQDISC, F_REQUEST | F_DUMP, body)])
    return [q for q in rows if not ifindex or q["ifindex"] == ifindex]


def find(ns_path: str, ifindex: int, parent: int) -> dict[str, Any] | None:
    return next((q for q in qdiscs(ns_path, ifindex) if q["parent"] == parent), None)


def delete(ns_path: str, ifindex: int, parent: int) -> bool:
    """Delete the qdisc at `parent` (TC_H_ROOT or TC_H_INGRESS). False if there was none to delete."""
    handle = 0xFFFF0000 if parent == TC_H_INGRESS else 0
    body = _TCMSG.pack(0, ifindex, handle, parent, 0)
    try:
        run_in_netns(ns_path, lambda: _talk(RTM_DELQDISC, F_REQUEST | F_ACK, body))
    except OSError as e:
        if e.errno in (2, 22, 19):  # ENOENT / EINVAL (only the default is left) / ENODEV (interface gone)
            return False
        raise
    return True


def restore(ns_path: str, ifindex: int, snap: dict[str, Any]) -> None:
    """Put back a qdisc exactly as snapshotted (kind, handle, parent, option bytes)."""
    body = _TCMSG.pack(0, ifindex, snap["handle"], snap["parent"], 0) + _attr(TCA_KIND, snap["kind"].encode() + b"\0")
    if snap.get("options") is not None:
        body += _attr(snap["options"]["type"], bytes.fromhex(snap["options"]["hex"]))
    run_in_netns(ns_path, lambda: _talk(RTM_NEWQDISC, F_REQUEST | F_ACK | F_CREATE | F_REPLACE, body))


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
