"""Whether this host has an NVIDIA GPU whose health agent reads the kernel log: a test writes NVIDIA XID lines to
/dev/kmsg only where it has none."""

from __future__ import annotations

from pathlib import Path

import pytest


def nvidia_devices(dev: Path = Path("/dev")) -> list[str]:
    """The NVIDIA driver's device nodes here (/dev/nvidia0, /dev/nvidiactl, /dev/nvidia-uvm, ...)."""
    return sorted(str(p) for p in dev.glob("nvidia*"))


def xid_unsafe(dev: Path = Path("/dev")) -> str | None:
    """Why no XID line may be written to this host's kernel log (None: it may). On a GPU node the driver's lines
    are read by its health agent (NVSentinel, the DRA driver, node-problem-detector, DCGM), which cordons, drains
    or resets the node on a critical XID: a test's line is indistinguishable from the driver's."""
    found = nvidia_devices(dev)
    if not found:
        return None
    return (f"writes NVIDIA XID lines to the kernel log, and this host has an NVIDIA GPU ({', '.join(found[:3])}): "
            "its health agent would react to them")


XID_UNSAFE = xid_unsafe()
# for a test that writes XID lines to this host's /dev/kmsg (directly, or through `chaoskit run` of a gpu.xid fault)
writes_xid = pytest.mark.skipif(XID_UNSAFE is not None, reason=str(XID_UNSAFE))
