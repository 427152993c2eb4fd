"""Host capability checks: which fault families and probes this machine can do, and why not."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Check:
    area: str
    ok: bool
    detail: str


def _root() -> Check:
    ok = os.geteuid() == 0
    return Check("root", ok, "running as root" if ok else "not root: kernel faults (netns, qdiscs, nftables, "
                                                             "cgroups, eBPF) need root")


def _process() -> Check:
    return Check("process.signal", True, "signals to processes you own" + (" (any process: root)"
                                                                           if os.geteuid() == 0 else ""))


def _memory() -> Check:
    from chaoskit.injectors.memory import meminfo
    from chaoskit.spec.units import format_size

    m = meminfo()
    return Check("host.memory_pressure", True,
                 f"{format_size(m['MemAvailable'])} available of {format_size(m['MemTotal'])}")


def _netem() -> Check:
    if os.geteuid() != 0:
        return Check("network.netem (kernel)", False, "needs root to create a test namespace")
    from chaoskit.targets.tc import netem_missing_reason

    reason = netem_missing_reason()
    return Check("network.netem (kernel)", reason is None, reason or "sch_netem available (checked in a throwaway netns)")


def _nft() -> Check:
    from chaoskit.targets import nftables

    try:
        n = len(nftables.tables("/proc/self/ns/net"))
    except (nftables.NftError, OSError) as e:
        return Check("nftables (network.drop/partition)", False, str(e))
    return Check("nftables (network.drop/partition)", True, f"libnftables JSON API works ({n} tables here)")


def _cgroup_io() -> Check:
    v2 = Path("/sys/fs/cgroup/cgroup.controllers")
    unified = Path("/sys/fs/cgroup/unified/cgroup.controllers")
    for f in (v2, unified):
        if f.exists() and "io" in f.read_text().split():
            return Check("block I/O throttling", True, f"cgroup v2 io controller ({f.parent})")
    if Path("/sys/fs/cgroup/blkio/blkio.throttle.read_bps_device").exists():
        return Check("block I/O throttling", True, "cgroup v1 blkio.throttle (no v2 io controller)")
    return Check("block I/O throttling", False, "neither cgroup v2 io controller nor v1 blkio is mounted")


def _ebpf() -> Check:
    import asyncio

    from chaoskit.errors import PreflightError
    from chaoskit.probes.ebpf import EbpfProbe, EbpfProbeSpec

    probe = EbpfProbe(EbpfProbeSpec(type="ebpf", name="doctor", program="runqueue_latency"))
    try:
        probe.preflight()  # root, tracefs, headers, bcc, and a real compile + attach
    except PreflightError as e:
        return Check("eBPF probes (bcc)", False, str(e).removeprefix("ebpf: "))
    asyncio.run(probe.close())
    btf = "BTF present" if Path("/sys/kernel/btf/vmlinux").exists() else "no BTF (bpftrace limited)"
    return Check("eBPF probes (bcc)", True, f"compiled and attached a tracepoint program; {btf}")


def _load_sender() -> Check:
    from chaoskit.errors import ChaoskitError
    from chaoskit.load import native

    try:
        lib = native.build()
    except ChaoskitError as e:
        return Check("load sender (native)", False, f"{e}; `chaoskit load` falls back to the asyncio sender")
    return Check("load sender (native)", True, f"built {lib}")


def _nvml() -> Check:
    try:
        import pynvml

        pynvml.nvmlInit()
        n = pynvml.nvmlDeviceGetCount()
        pynvml.nvmlShutdown()
        return Check("GPU (NVML)", n > 0, f"{n} GPU(s)")
    except Exception as e:
        return Check("GPU (NVML)", False, f"NVML unavailable: {type(e).__name__}: {e}".strip())


def _kube() -> Check:
    if os.environ.get("KUBERNETES_SERVICE_HOST"):
        return Check("Kubernetes", True, "in-cluster service account")
    cfg = Path(os.environ.get("KUBECONFIG", Path.home() / ".kube" / "config"))
    return Check("Kubernetes", cfg.exists(), f"kubeconfig {cfg}" if cfg.exists() else "no kubeconfig, not in a pod")


CHECKS: tuple[Callable[[], Check], ...] = (_root, _process, _memory, _netem, _nft, _cgroup_io, _ebpf, _load_sender, _nvml,
                                         _kube)


def run_checks() -> list[Check]:
    out = []
    for fn in CHECKS:
        try:
            out.append(fn())
        except Exception as e:  # a broken check says so; doctor itself never crashes
            out.append(Check(fn.__name__.strip("_"), False, f"check failed: {type(e).__name__}: {e}"))
    return out


def python_info() -> str:
    return f"Python {sys.version.split()[0]} at {sys.executable}"
