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


def _watchdog() -> Check:
    from chaoskit.targets.cgroups import hierarchy_roots

    roots = hierarchy_roots()
    if os.geteuid() != 0:
        return Check("watchdog survives a whole-job kill", False,
                     "not root: the watchdog leaves the job's session and process group but stays in its cgroups, "
                     "so a CI cancel that kills the job's cgroup takes it too; run `chaoskit rollback --all` after")
    return Check("watchdog survives a whole-job kill", bool(roots),
                 f"as root it moves itself into the root cgroup of {len(roots)} hierarchies "
                 f"({', '.join(str(r) for r in roots)}) and its own session" if roots else "no cgroup hierarchy mounted")


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


def _cuda() -> Check:
    from chaoskit.errors import PreflightError
    from chaoskit.gpu.cuda import Driver, library_path

    try:
        drv = Driver()
        n = drv.device_count()
    except PreflightError as e:
        return Check("GPU memory pressure (CUDA driver)", False, str(e))
    return Check("GPU memory pressure (CUDA driver)", n > 0, f"{library_path()} loaded, {n} CUDA device(s)")


def _nvml() -> Check:
    from chaoskit.errors import PreflightError
    from chaoskit.gpu import nvml
    from chaoskit.spec.units import format_size

    try:
        devs = nvml.devices()
    except PreflightError as e:
        return Check("GPU (NVML: nvml probe, gpu.mig)", False, str(e))
    mig = {True: "MIG enabled", False: "MIG capable, disabled"}
    rows = [f"{d.index}: {d.name} {d.uuid} {format_size(d.memory_total)} {d.pci_bus_id} "
            + (mig[bool(d.mig_current)] + (" (change pending)" if d.mig_pending != d.mig_current else "")
               if d.mig_capable else "not MIG-capable") for d in devs]
    return Check("GPU (NVML: nvml probe, gpu.mig)", bool(devs), "; ".join(rows) or "NVML sees no GPU")


def _kmsg() -> Check:
    ok = os.access("/dev/kmsg", os.W_OK)
    return Check("kernel log (gpu.xid, kernel_log)", ok and os.access("/dev/kmsg", os.R_OK),
                 "/dev/kmsg readable and writable" if ok else "/dev/kmsg not writable (gpu.xid needs root)")


def _kube() -> Check:
    if os.environ.get("KUBERNETES_SERVICE_HOST"):
        return Check("Kubernetes", True, "in-cluster service account")
    cfg = Path(os.environ.get("KUBECONFIG", Path.home() / ".kube" / "config"))
    return Check("Kubernetes", cfg.exists(), f"kubeconfig {cfg}" if cfg.exists() else "no kubeconfig, not in a pod")


CHECKS: tuple[Callable[[], Check], ...] = (_root, _watchdog, _process, _memory, _netem, _nft, _cgroup_io, _ebpf, _load_sender, _cuda,
                                         _nvml, _kmsg, _kube)


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
