"""The nft side of network.netem's queue mode: a chaoskit table whose hook chain sends the selected packets to an
NFQUEUE (xt target through nft_compat: this kernel family may lack nft's own `queue`), with the bypass flag."""

from __future__ import annotations

import errno
import ipaddress
import socket
import struct
from typing import Any

from chaoskit.targets import nftables
from chaoskit.targets.netns import run_in_netns

FAMILY = "inet"
QUEUE_CHAIN = "queue"
# egress: postrouting late (after NAT), nearest to where sch_netem sits; ingress: prerouting before conntrack
HOOKS = {"egress": ("postrouting", "oif", 300), "ingress": ("prerouting", "iif", -300)}
COPY_MARK = 0x4E51  # the helper's duplicates carry this mark; the rule lets them pass

NETLINK_NETFILTER, NFNL_SUBSYS_NFTABLES = 12, 10
NFNL_MSG_BATCH_BEGIN, NFNL_MSG_BATCH_END = 0x10, 0x11
NFT_MSG_NEWRULE = NFNL_SUBSYS_NFTABLES << 8 | 6
NLM_F_REQUEST, NLM_F_ACK, NLM_F_CREATE, NLM_F_APPEND = 0x1, 0x4, 0x400, 0x800
NLMSG_ERROR, NLA_F_NESTED = 2, 0x8000
NFPROTO_INET = 1
NFQ_FLAG_BYPASS = 0x01
NFQUEUE_REVISION = 3  # struct xt_NFQ_info_v3 {u16 queuenum, queues_total, flags}


def hook_chain(direction: str) -> str:
    return HOOKS[direction][0]


def _match(left: dict[str, Any], right: Any, op: str = "==") -> dict[str, Any]:
    return {"match": {"op": op, "left": left, "right": right}}


def _addr(value: str) -> Any:
    net = ipaddress.ip_network(value, strict=False)
    if net.num_addresses == 1:
        return str(net.network_address)
    return {"prefix": {"addr": str(net.network_address), "len": net.prefixlen}}


def selection(direction: str, ifname: str, destinations: list[str] | None, ports: list[int] | None
              ) -> list[dict[str, Any]]:
    """The matches of the one rule that sends packets to the queue chain (destination and port as network.netem's
    u32 filter: IPv4 destination, TCP/UDP destination port, in either direction)."""
    _, dev_key, _ = HOOKS[direction]
    out = [_match({"meta": {"key": "mark"}}, COPY_MARK, "!="), _match({"meta": {"key": dev_key}}, ifname)]
    if destinations:
        out.append(_match({"payload": {"protocol": "ip", "field": "daddr"}}, {"set": [_addr(d) for d in destinations]}))
    if ports:
        out.append(_match({"meta": {"key": "l4proto"}}, {"set": ["tcp", "udp"]}))
        out.append(_match({"payload": {"protocol": "th", "field": "dport"}}, {"set": list(ports)}))
    return out


def table_commands(table: str, direction: str, matches: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The table, its (still empty) queue chain, and the hook chain whose one rule jumps there."""
    hook, _, prio = HOOKS[direction]
    return [
        {"add": {"table": {"family": FAMILY, "name": table}}},
        {"add": {"chain": {"family": FAMILY, "table": table, "name": QUEUE_CHAIN}}},
        {"add": {"chain": {"family": FAMILY, "table": table, "name": hook, "type": "filter", "hook": hook,
                           "prio": prio, "policy": "accept"}}},
        {"add": {"rule": {"family": FAMILY, "table": table, "chain": hook,
                          "expr": [*matches, {"counter": None}, {"jump": {"target": QUEUE_CHAIN}}]}}},
    ]


# ---------------------------------------------------------------- the NFQUEUE rule, as nfnetlink messages


def _nla(kind: int, payload: bytes) -> bytes:
    size = 4 + len(payload)
    return struct.pack("=HH", size, kind) + payload + b"\0" * (-size % 4)


def _nest(kind: int, *parts: bytes) -> bytes:
    return _nla(kind | NLA_F_NESTED, b"".join(parts))


def _msg(kind: int, flags: int, seq: int, family: int, res_id: int, body: bytes = b"") -> bytes:
    payload = struct.pack("=BBH", family, 0, socket.htons(res_id)) + body
    return struct.pack("=IHHII", 16 + len(payload), kind, flags, seq, 0) + payload


def queue_rule_batch(table: str, queue: int) -> bytes:
    """One nfnetlink batch adding `xt NFQUEUE --queue-num queue --queue-bypass` to the table's queue chain."""
    info = struct.pack("=HHHxx", queue, 1, NFQ_FLAG_BYPASS)
    target = _nest(2, _nla(1, b"NFQUEUE\0"), _nla(2, struct.pack(">I", NFQUEUE_REVISION)), _nla(3, info))
    expr = _nest(1, _nla(1, b"target\0"), target)  # NFTA_LIST_ELEM {NFTA_EXPR_NAME, NFTA_EXPR_DATA}
    body = _nla(1, table.encode() + b"\0") + _nla(2, QUEUE_CHAIN.encode() + b"\0") + _nest(4, expr)
    return (_msg(NFNL_MSG_BATCH_BEGIN, NLM_F_REQUEST, 1, 0, NFNL_SUBSYS_NFTABLES)
            + _msg(NFT_MSG_NEWRULE, NLM_F_REQUEST | NLM_F_ACK | NLM_F_CREATE | NLM_F_APPEND, 2, NFPROTO_INET, 0, body)
            + _msg(NFNL_MSG_BATCH_END, NLM_F_REQUEST, 3, 0, NFNL_SUBSYS_NFTABLES))


def _send_batch(batch: bytes) -> None:
    with socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_NETFILTER) as s:
        s.bind((0, 0))
        s.settimeout(5)
        s.send(batch)
        while True:
            data = s.recv(1 << 16)
            off = 0
            while off + 20 <= len(data):
                size, kind, _flags, seq, _pid = struct.unpack_from("=IHHII", data, off)
                if kind == NLMSG_ERROR:
                    err = struct.unpack_from("=i", data, off + 16)[0]
                    if err:
                        raise nftables.NftError(f"adding the NFQUEUE rule: {errno.errorcode.get(-err, err)} "
                                                "(the kernel needs NFT_COMPAT and NETFILTER_XT_TARGET_NFQUEUE)")
                    if seq == 2:
                        return
                off += max(size, 16)


def install(ns_path: str, table: str, direction: str, matches: list[dict[str, Any]], queue: int) -> None:
    """Create the table with its jump rule, then the NFQUEUE rule (packets are queued from that moment on)."""
    nftables.run(ns_path, table_commands(table, direction, matches))
    run_in_netns(ns_path, lambda: _send_batch(queue_rule_batch(table, queue)))


def withdraw(ns_path: str, table: str, direction: str) -> None:
    """Flush the hook chain: no packet is queued any more, and the ones held stay held (deleting the table would
    unregister the hook, and the kernel drops every packet queued from it)."""
    if nftables.has_table(ns_path, FAMILY, table):
        nftables.run(ns_path, [{"flush": {"chain": {"family": FAMILY, "table": table, "name": hook_chain(direction)}}}])


def remove(ns_path: str, table: str) -> None:
    """Delete the table whole (both chains, both rules), when it is there."""
    if nftables.has_table(ns_path, FAMILY, table):
        nftables.run(ns_path, [{"delete": {"table": {"family": FAMILY, "name": table}}}])


def present(ns_path: str, table: str) -> bool:
    return nftables.has_table(ns_path, FAMILY, table)
