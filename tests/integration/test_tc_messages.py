"""chaoskit.targets.tc: qdisc snapshots and restores built with pyroute2's tcmsg, decoded with pyroute2, and applied
to real namespaces the tests create (tbf, bfifo, ingress; netem only as far as this kernel goes)."""

from __future__ import annotations

import errno
import os

import pytest
from pyroute2.netlink import NLA_F_NESTED, NLM_F_ACK, NLM_F_CREATE, NLM_F_REPLACE, NLM_F_REQUEST, rtnl
from pyroute2.netlink.rtnl import RTM_NEWQDISC
from pyroute2.netlink.rtnl.tcmsg import tcmsg

from chaoskit.injectors.netem.fault import ROOT_HANDLE, Bandwidth, Netem
from chaoskit.injectors.netem.netlink import netem_message
from chaoskit.targets import tc
from chaoskit.targets.netns import with_iproute
from tests.helpers.netpair import Pair, sh

ROOT = pytest.mark.skipif(os.geteuid() != 0, reason="network namespaces need root")
NETEM_MISSING = tc.netem_missing_reason() if os.geteuid() == 0 else "not root"
NEW = NLM_F_REQUEST | NLM_F_ACK | NLM_F_CREATE | NLM_F_REPLACE
NETEM = Netem.Spec(type="network.netem", target={"netns": "x"}, delay="15ms", jitter="5ms", loss="1%",
                   duplicate="0.5%", reorder="25%", gap=5, rate="10mbit", limit=2000)


def decode(msg, cls=tcmsg):
    """Encode a message as it goes on the wire and decode it again with `cls` (pyroute2's own tcmsg by default)."""
    msg.encode()
    out = cls(bytes(msg.data))
    out.decode()
    return out


def test_the_parents_chaoskit_names_are_pyroute2s():
    """tc spells TC_H_ROOT and TC_H_INGRESS itself (it imports pyroute2 only where a message is made)."""
    assert (tc.TC_H_ROOT, tc.TC_H_INGRESS) == (rtnl.TC_H_ROOT, rtnl.TC_H_INGRESS)


def as_dumped(msg) -> dict:
    """The snapshot chaoskit would record if the kernel dumped exactly this message."""
    return tc.snapshot(decode(msg, tc.qdisc_message_class()))


# ------------------------------------------------------------------ what is sent (no kernel needed)


@pytest.mark.parametrize("flags", [0, NLA_F_NESTED])
def test_restore_message_round_trips_a_snapshot_exactly(flags):
    snap = {"ifindex": 4, "handle": 0x50000, "parent": tc.TC_H_ROOT, "kind": "tbf",
            "options": {"type": 2 | flags, "hex": "0c00040000f2052a01000000"}}
    assert as_dumped(tc.restore_message(4, snap)) == snap
    sent = decode(tc.restore_message(4, snap))
    assert (sent["index"], sent["handle"], sent["parent"], sent.get_attr("TCA_KIND")) == (4, 0x50000, tc.TC_H_ROOT,
                                                                                           "tbf")


def test_restore_message_of_an_optionless_qdisc_sends_no_options():
    snap = {"ifindex": 2, "handle": 0xFFFF0000, "parent": tc.TC_H_INGRESS, "kind": "ingress", "options": None}
    sent = decode(tc.restore_message(2, snap))
    assert [a.name for a in sent["attrs"]] == ["TCA_KIND"]
    assert as_dumped(tc.restore_message(2, snap)) == snap


def test_a_netem_snapshot_is_restored_with_the_same_netem_options():
    """A previous netem root qdisc (someone else's) put back after a fault: pyroute2's netem decoder reads the
    restore message's options as the netem parameters that were there, byte for byte."""
    original = netem_message(NETEM, ifindex=7, parent=tc.TC_H_ROOT, handle=0x10000)
    snap = as_dumped(original)
    assert snap["kind"] == "netem" and snap["handle"] == 0x10000
    want, got = decode(original).get_attr("TCA_OPTIONS"), decode(tc.restore_message(7, snap)).get_attr("TCA_OPTIONS")
    for field in ("delay", "jitter", "limit", "loss", "duplicate", "gap"):
        assert got[field] == want[field]
    assert got["limit"] == 2000 and got["gap"] == 5
    for nla in ("TCA_NETEM_REORDER", "TCA_NETEM_RATE"):
        assert got.get_attr(nla) == want.get_attr(nla)
    assert got.get_attr("TCA_NETEM_RATE")["rate"] == 10_000_000 // 8
    resent = as_dumped(tc.restore_message(7, snap))
    assert resent == snap


# ------------------------------------------------------------------ real namespaces


@pytest.fixture
def pair():
    p = Pair()
    yield p
    p.close()


def _index(pair: Pair, ns: str) -> int:
    return with_iproute(pair.path(ns), lambda ipr: ipr.link_lookup(ifname="eth0")[0])


def _tc(pair: Pair, *argv: str) -> None:
    sh("ip", "netns", "exec", pair.srv, "tc", "qdisc", *argv)


@ROOT
def test_snapshots_agree_with_tc(pair):
    _tc(pair, "add", "dev", "eth0", "root", "handle", "5:", "tbf", "rate", "3mbit", "burst", "20k", "latency", "70ms")
    _tc(pair, "add", "dev", "eth0", "ingress")
    index = _index(pair, pair.srv)
    mine = {(q["kind"], q["handle"] >> 16, q["parent"]) for q in tc.qdiscs(pair.path(pair.srv), index)}
    theirs = {(q["kind"], int(q["handle"].rstrip(":"), 16), tc.TC_H_ROOT if q.get("root") else tc.TC_H_INGRESS)
              for q in pair.qdiscs(pair.srv) if q["dev"] == "eth0"}
    assert mine == theirs == {("tbf", 5, tc.TC_H_ROOT), ("ingress", 0xFFFF, tc.TC_H_INGRESS)}
    assert tc.find(pair.path(pair.srv), index, tc.TC_H_INGRESS)["handle"] == 0xFFFF0000
    assert tc.qdiscs(pair.path(pair.srv), index + 1000) == []


@ROOT
@pytest.mark.parametrize("qdisc", [
    ("tbf", "rate", "3mbit", "burst", "20k", "latency", "70ms"),
    ("tbf", "rate", "40gbit", "burst", "1mb", "latency", "10ms"),  # dumps TCA_TBF_RATE64 too
    ("bfifo", "limit", "12345"),
    ("pfifo", "limit", "77"),
])
def test_delete_and_restore_are_byte_exact(pair, qdisc):
    _tc(pair, "add", "dev", "eth0", "root", "handle", "5:", *qdisc)
    ns, index = pair.path(pair.srv), _index(pair, pair.srv)
    before, shown = tc.find(ns, index, tc.TC_H_ROOT), pair.qdiscs(pair.srv)
    assert before["kind"] == qdisc[0] and before["handle"] == 0x50000
    assert tc.delete(ns, index, tc.TC_H_ROOT)
    assert tc.is_default(tc.find(ns, index, tc.TC_H_ROOT))
    tc.restore(ns, index, before)
    assert tc.find(ns, index, tc.TC_H_ROOT) == before and pair.qdiscs(pair.srv) == shown


@ROOT
def test_why_options_stay_raw_bytes(pair):
    """pyroute2's tbf decoder does not know TCA_TBF_RATE64 (it decodes as UNKNOWN and would be dropped on
    encode): a decode/encode round trip through it could not restore a 40gbit tbf; the raw bytes do (above)."""
    _tc(pair, "add", "dev", "eth0", "root", "handle", "5:", "tbf", "rate", "40gbit", "burst", "1mb", "latency", "10ms")
    snap = tc.find(pair.path(pair.srv), _index(pair, pair.srv), tc.TC_H_ROOT)
    opts = decode(tc.restore_message(snap["ifindex"], snap)).get_attr("TCA_OPTIONS")
    assert [a.name for a in opts["attrs"]] == ["TCA_TBF_PARMS", "UNKNOWN"]


@ROOT
def test_ingress_is_found_and_deleted_once(pair):
    _tc(pair, "add", "dev", "eth0", "ingress")
    ns, index = pair.path(pair.srv), _index(pair, pair.srv)
    snap = tc.find(ns, index, tc.TC_H_INGRESS)
    assert snap["kind"] == "ingress" and snap["handle"] == 0xFFFF0000
    assert tc.delete(ns, index, tc.TC_H_INGRESS)
    assert tc.find(ns, index, tc.TC_H_INGRESS) is None
    assert not tc.delete(ns, index, tc.TC_H_INGRESS)  # none left to delete
    tc.restore(ns, index, snap)
    assert tc.find(ns, index, tc.TC_H_INGRESS) == snap


@ROOT
def test_delete_of_nothing_or_of_a_gone_interface_is_false(pair):
    ns, index = pair.path(pair.srv), _index(pair, pair.srv)
    assert not tc.delete(ns, index, tc.TC_H_ROOT)  # only the kernel default is there
    assert not tc.delete(ns, index + 1000, tc.TC_H_ROOT)  # ENODEV


@ROOT
def test_bandwidth_revert_restores_a_rate64_tbf_byte_exactly(pair):
    _tc(pair, "add", "dev", "eth0", "root", "handle", "5:", "tbf", "rate", "40gbit", "burst", "1mb", "latency", "10ms")
    before = pair.qdiscs(pair.srv)
    inj = Bandwidth(Bandwidth.Spec(type="network.bandwidth", target={"netns": pair.srv}, rate="16mbit"))
    inj.preflight()
    rec = inj.apply(inj.prepare())
    assert tc.find(rec.ns, rec.ifindex, tc.TC_H_ROOT)["handle"] == ROOT_HANDLE
    Bandwidth.revert(rec)
    assert rec.previous is not None
    assert pair.qdiscs(pair.srv) == before and tc.find(rec.ns, rec.ifindex, tc.TC_H_ROOT) == rec.previous.to_json()


def payload(msg) -> bytes:
    """The message's bytes after the netlink header (whose length and sequence number vary per send)."""
    msg.encode()
    return bytes(msg.data[16:msg["header"]["length"]])


@pytest.fixture
def sent(monkeypatch) -> list[tuple[int, int, bytes]]:
    """(type, flags, payload) of every tcmsg chaoskit sends through tc.request, answered or refused."""
    out: list[tuple[int, int, bytes]] = []
    original = tc.request

    def recording(ipr, msg, msg_type, flags):
        try:
            return original(ipr, msg, msg_type, flags)
        finally:
            out.append((msg_type, flags, bytes(msg.data[16:msg["header"]["length"]])))

    monkeypatch.setattr(tc, "request", recording)
    return out


def expected(msg, msg_type: int, flags: int) -> tuple[int, int, bytes]:
    msg["header"]["type"], msg["header"]["flags"] = msg_type, flags
    return msg_type, flags, payload(msg)


@ROOT
def test_netem_messages_reach_the_kernel(pair, sent):
    """What network.netem sends and what a netem restore sends are well-formed for the kernel: on a kernel without
    sch_netem it refuses only the kind (ENOENT), not the message (EINVAL); with netem, the qdisc is there."""
    ns, index = pair.path(pair.srv), _index(pair, pair.srv)
    msg = netem_message(NETEM, index, tc.TC_H_ROOT, ROOT_HANDLE)
    snap = {**as_dumped(netem_message(NETEM, index, tc.TC_H_ROOT, 0x10000)), "ifindex": index}
    if NETEM_MISSING is not None:
        with pytest.raises(OSError) as refused:
            with_iproute(ns, lambda ipr: tc.request(ipr, msg, RTM_NEWQDISC, NEW))
        with pytest.raises(OSError) as restored:
            tc.restore(ns, index, snap)
        assert refused.value.errno == restored.value.errno == errno.ENOENT
        # what the restore sent, byte for byte: the message restore_message builds from the snapshot
        assert sent[-1][2] == payload(tc.restore_message(index, snap)) and sent[-1][0] == RTM_NEWQDISC
        return
    with_iproute(ns, lambda ipr: tc.request(ipr, msg, RTM_NEWQDISC, NEW))
    assert tc.find(ns, index, tc.TC_H_ROOT)["kind"] == "netem"
    tc.restore(ns, index, snap)
    assert tc.find(ns, index, tc.TC_H_ROOT)["handle"] == 0x10000


@ROOT
def test_netem_injector_sends_its_message(pair, sent):
    ns, index = pair.path(pair.srv), _index(pair, pair.srv)
    inj = Netem(Netem.Spec(type="network.netem", target={"netns": pair.srv}, delay="15ms"))
    try:
        with_iproute(ns, lambda ipr: inj._add_leaf(ipr, index, tc.TC_H_ROOT, ROOT_HANDLE))
    except Exception as e:  # no sch_netem here: the kernel's ENOENT is the expected answer to a well-formed send
        if getattr(e, "errno", None) != errno.ENOENT:
            raise
    # the bytes sent are netem_message's for this spec, with or without sch_netem in this kernel
    assert sent == [expected(netem_message(inj.spec, index, tc.TC_H_ROOT, ROOT_HANDLE), RTM_NEWQDISC, NEW)]
    if NETEM_MISSING is None:  # a kernel with sch_netem took it
        assert tc.find(ns, index, tc.TC_H_ROOT)["kind"] == "netem"
