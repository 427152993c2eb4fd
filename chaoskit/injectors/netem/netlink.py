"""network.netem's RTM_NEWQDISC message, built with pyroute2's encoders (plus the delay-distribution table
pyroute2 leaves out)."""

from __future__ import annotations

import socket
import struct
from typing import Any

from pyroute2.netlink import nla
from pyroute2.netlink.rtnl.tcmsg import sched_netem, tcmsg

from chaoskit.injectors.netem.dist import dist_file
from chaoskit.units import parse_rate


class _NetemOptions(nla):
    """pyroute2's netem options plus the delay-distribution table (pyroute2 leaves it out). Not a subclass of
    sched_netem.options: pyroute2 caches compiled attribute tables on the class, and a subclass would inherit them."""

    _base = sched_netem.options
    fields = _base.fields
    nla_map = tuple((n, "cdata") if n == "TCA_NETEM_DELAY_DIST" else (n, t) for n, t in _base.nla_map)
    netem_corr, netem_reorder = _base.netem_corr, _base.netem_reorder
    netem_corrupt, netem_rate = _base.netem_corrupt, _base.netem_rate


class NetemMessage(tcmsg):
    """tcmsg whose TCA_OPTIONS encode with _NetemOptions. pyroute2 caches the compiled attribute table on the
    class (name-mangled attributes of nlmsg_base); reset them so this subclass compiles its own."""

    _nlmsg_base__compiled_nla = False
    _nlmsg_base__t_nla_map = None
    _nlmsg_base__r_nla_map = None

    @staticmethod
    def get_options(self, *argv, **kwarg):
        return _NetemOptions


def dist_table(name: str) -> bytes:
    """iproute2's distribution table (NETEM_DIST_SCALE units) as the s16 array the kernel expects."""
    text = dist_file(name).read_text()
    vals = [int(x) for line in text.splitlines() if not line.startswith("#") for x in line.split()]
    return struct.pack(f"={len(vals)}h", *vals)


def netem_message(spec: Any, ifindex: int, parent: int, handle: int) -> NetemMessage:
    """The RTM_NEWQDISC message for `spec` (built with pyroute2's encoders)."""
    pct = 100.0  # pyroute2 takes percentages
    opts = sched_netem.get_parameters({
        "delay": round(spec.delay * 1e6), "jitter": round(spec.jitter * 1e6), "limit": spec.limit,
        "loss": spec.loss * pct, "duplicate": spec.duplicate * pct, "gap": spec.gap,
        "delay_corr": spec.correlation * pct, "loss_corr": spec.loss_correlation * pct,
        "dup_corr": spec.duplicate_correlation * pct,
        "prob_reorder": spec.reorder * pct, "corr_reorder": spec.reorder_correlation * pct,
        "prob_corrupt": spec.corrupt * pct, "corr_corrupt": spec.corrupt_correlation * pct,
        "rate": parse_rate(spec.rate) if spec.rate is not None else None,
    })
    if spec.distribution != "uniform":
        opts["attrs"].append(["TCA_NETEM_DELAY_DIST", dist_table(spec.distribution)])
    msg = NetemMessage()
    msg["family"] = socket.AF_UNSPEC
    msg["index"], msg["handle"], msg["parent"], msg["info"] = ifindex, handle, parent, 0
    msg["attrs"] = [["TCA_KIND", "netem"], ["TCA_OPTIONS", opts]]
    return msg
