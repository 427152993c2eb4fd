"""Host capability checks: what this machine can do, why not, what provides it (Debian/Ubuntu, RHEL), --fix."""

from __future__ import annotations

import glob
import gzip
import os
import subprocess
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

KERNEL = os.uname().release
TRACEFS = Path("/sys/kernel/tracing")


@dataclass(frozen=True)
class Need:
    """What a fault family or probe may declare in `host_needs`: a doctor check, in words, and the REQUIREMENTS
    (ids) that provide it; the prerequisites reference page is generated from these and the classes."""

    id: str
    what: str
    requirements: tuple[str, ...] = ()


# the checks a fault family or probe may name in its class's `host_needs` (what a failed one blocks is derived
# from those declarations: blocked())
NEED_LIST = (
    Need("root", "root (euid 0): network namespaces, qdiscs, nftables, cgroups, eBPF", ("root",)),
    Need("signals", "signals to the target processes: your own, or any process as root"),
    Need("meminfo", "/proc/meminfo (what memory is available)"),
    Need("netem", "the sch_netem qdisc (mode qdisc), or NFQUEUE and a C compiler (mode queue)",
         ("root", "netem", "cc")),
    Need("nftables", "nftables through libnftables' JSON API", ("root", "nftables")),
    Need("cgroup-io", "block I/O throttling: the cgroup v2 io controller or v1 blkio", ("root", "cgroup-io")),
    Need("ebpf", "bcc compiling and attaching tracepoint and kprobe programs",
         ("root", "bcc", "bcc-site", "kernel-headers", "tracefs")),
    Need("native-sender", "a C compiler for the native load sender (else the Python sender is used)", ("cc",)),
    Need("cuda", "an NVIDIA GPU and the CUDA driver library (libcuda.so.1)", ("nvidia-gpu", "nvidia-driver")),
    Need("nvml", "an NVIDIA GPU and NVML (libnvidia-ml.so.1)", ("nvidia-gpu", "nvidia-driver")),
    Need("kmsg", "/dev/kmsg readable and writable (root)", ("root",)),
    Need("kube", "a Kubernetes API: a kubeconfig or a pod's service account", ("kubeconfig",)),
)
NEEDS = tuple(n.id for n in NEED_LIST)

# where distributions put bcc's Python module (Debian/Ubuntu, RHEL/Fedora, a source build)
SYSTEM_BCC = ("/usr/lib/python3/dist-packages/bcc", "/usr/lib/python3*/site-packages/bcc",
              "/usr/lib64/python3*/site-packages/bcc", "/usr/local/lib/python3*/dist-packages/bcc",
              "/usr/local/lib/python3*/site-packages/bcc")


@dataclass(frozen=True)
class Requirement:
    """Something a capability needs and what provides it: packages per family ({kernel} = uname -r), a kernel
    option, commands besides packages; `installable` False: --fix says it, never runs anything for it."""

    id: str
    what: str
    debian: tuple[str, ...] = ()
    rhel: tuple[str, ...] = ()
    kernel_option: str = ""
    commands: tuple[tuple[str, ...], ...] = ()
    installable: bool = True
    note: str = ""

    def packages(self, family: str) -> list[str]:
        return [p.format(kernel=KERNEL) for p in (self.debian if family == "debian" else self.rhel)]

    def kernel_specific(self, family: str) -> bool:
        return any("{kernel}" in p for p in (self.debian if family == "debian" else self.rhel))

    def remedy(self) -> str:
        """One line: both package families, the kernel option, the commands, the note."""
        parts = []
        if self.debian:
            parts.append(f"Debian/Ubuntu: apt-get install {' '.join(self.packages('debian'))}")
        if self.rhel:
            parts.append(f"RHEL-family: dnf install {' '.join(self.packages('rhel'))}")
        if self.kernel_option:
            parts.append(f"kernel option {self.kernel_option}")
        parts += [f"then {' '.join(c)}" if self.debian or self.rhel else " ".join(c) for c in self.commands]
        if self.note:
            parts.append(self.note)
        return "; ".join(parts)

    def to_json(self) -> dict[str, Any]:
        return {"id": self.id, "what": self.what, "debian": self.packages("debian"), "rhel": self.packages("rhel"),
                "kernel_option": self.kernel_option, "commands": [list(c) for c in self.commands],
                "installable": self.installable, "note": self.note, "remedy": self.remedy()}


REQUIREMENTS: dict[str, Requirement] = {r.id: r for r in (
    Requirement("root", "root", installable=False, note="run chaoskit as root (sudo chaoskit ...)"),
    Requirement("bcc", "bcc (the BPF compiler collection) and its Python module", debian=("python3-bpfcc",),
                rhel=("bcc-tools", "python3-bcc"),
                note="from the distribution, not PyPI; a venv or pipx install sees it only with system site packages"),
    Requirement("bcc-site", "bcc importable from this interpreter", installable=False,
                note="bcc is installed system-wide, but this interpreter does not see it: install chaoskit into a "
                     "venv made with `python3 -m venv --system-site-packages`, or `pipx install "
                     "--system-site-packages chaoskit` (with --force over an existing pipx install)"),
    Requirement("kernel-headers", f"the running kernel's headers (/lib/modules/{KERNEL}/build)",
                debian=("linux-headers-{kernel}",), rhel=("kernel-devel-{kernel}",),
                kernel_option="CONFIG_IKHEADERS=m (the kernel carries its own headers)"),
    Requirement("tracefs", f"tracefs mounted at {TRACEFS}", kernel_option="CONFIG_TRACING",
                commands=(("mount", "-t", "tracefs", "nodev", str(TRACEFS)),)),
    Requirement("nftables", "libnftables (nftables)", debian=("nftables",), rhel=("nftables",),
                kernel_option="CONFIG_NF_TABLES"),
    Requirement("cc", "a C compiler and the C library's headers", debian=("gcc", "libc6-dev"),
                rhel=("gcc", "glibc-devel")),
    Requirement("netem", "the sch_netem qdisc", debian=("linux-modules-extra-{kernel}",),
                rhel=("kernel-modules-extra-{kernel}",), kernel_option="CONFIG_NET_SCH_NETEM=m",
                commands=(("modprobe", "sch_netem"),),
                note="linux-modules-extra is Ubuntu's; Debian's linux-image kernels have sch_netem already"),
    Requirement("cgroup-io", "the cgroup v2 io controller (or v1 blkio)", installable=False,
                kernel_option="CONFIG_BLK_CGROUP and CONFIG_BLK_DEV_THROTTLING",
                note="with cgroup v2, enable io in the parent's cgroup.subtree_control"),
    Requirement("nvidia-driver", "the NVIDIA driver (libcuda.so.1, libnvidia-ml.so.1)",
                debian=("nvidia-driver", "libcuda1", "libnvidia-ml1"),
                rhel=("nvidia-driver", "nvidia-driver-cuda-libs", "nvidia-driver-NVML"), installable=False,
                note="not run by --fix: Debian needs its non-free component (Ubuntu: `ubuntu-drivers install`), "
                     "RHEL NVIDIA's CUDA repository; then a reboot"),
    Requirement("nvidia-gpu", "an NVIDIA GPU", installable=False,
                note="none on this host's PCI bus (vendor 0x10de): GPU faults run on a host with one"),
    Requirement("kubeconfig", "a Kubernetes API", installable=False,
                note="a kubeconfig ($KUBECONFIG or ~/.kube/config), or chaoskit in a pod with a service account"),
)}


def blocked(need: str) -> tuple[str, ...]:
    """The fault families and probes whose classes declare `need` in their `host_needs` (probes as `TYPE probe`):
    what a failed check of it blocks."""
    from chaoskit.injectors import INJECTORS
    from chaoskit.probes import PROBES

    return (tuple(sorted(c.type for c in INJECTORS if need in c.host_needs))
            + tuple(sorted(f"{c.type} probe" for c in PROBES if need in c.host_needs)))


@dataclass(frozen=True)
class Check:
    area: str
    ok: bool
    detail: str
    blocks: tuple[str, ...] = ()  # the injectors and probes this capability is for
    missing: tuple[str, ...] = ()  # REQUIREMENTS ids that would make it ok

    def to_json(self) -> dict[str, Any]:
        return {"area": self.area, "ok": self.ok, "detail": self.detail, "blocks": list(self.blocks),
                "missing": [REQUIREMENTS[m].to_json() for m in self.missing]}


def _is_root() -> bool:
    return os.geteuid() == 0


def _root() -> Check:
    ok = _is_root()
    return Check("root", ok, "running as root" if ok else "not root: kernel faults (netns, qdiscs, nftables, "
                                                           "cgroups, eBPF) need root",
                 blocked("root"), () if ok else ("root",))


def _process() -> Check:
    return Check("process.signal", True, "signals to processes you own" + (" (any process: root)"
                                                                           if _is_root() else ""),
                 blocked("signals"))


def _watchdog() -> Check:
    from chaoskit.targets.cgroups import hierarchy_roots

    roots = hierarchy_roots()
    if not _is_root():
        return Check("watchdog survives a whole-job kill", False,
                     "not root: the watchdog leaves the job's session and process group but stays in its cgroups, "
                     "so a CI cancel that kills the job's cgroup takes it too; run `chaoskit rollback --all` after",
                     ("every fault's revert after a CI job is cancelled",), ("root",))
    return Check("watchdog survives a whole-job kill", bool(roots),
                 f"as root it moves itself into the root cgroup of {len(roots)} hierarchies "
                 f"({', '.join(str(r) for r in roots)}) and its own session" if roots else "no cgroup hierarchy mounted",
                 ("every fault's revert after a CI job is cancelled",))


def _memory() -> Check:
    from chaoskit.injectors.memory.pressure import meminfo
    from chaoskit.units import format_size

    total, avail = meminfo()
    return Check("host.memory_pressure", True, f"{format_size(avail)} available of {format_size(total)}",
                 blocked("meminfo"))


# ---------------------------------------------------------------- the kernel

def kernel_config(option: str) -> str | None:
    """This kernel's CONFIG_X value ('y', 'm', 'n' for "is not set"); None when no config says."""
    for path in (Path("/proc/config.gz"), Path(f"/boot/config-{KERNEL}")):
        try:
            text = gzip.decompress(path.read_bytes()).decode() if path.suffix == ".gz" else path.read_text()
        except OSError:
            continue
        for line in text.splitlines():
            if line.startswith(f"{option}="):
                return line.split("=", 1)[1]
            if line == f"# {option} is not set":
                return "n"
        return "n"
    return None


def kernel_module(name: str) -> str | None:
    """Where this kernel has module `name`: 'loaded', 'builtin', its .ko file; None: nowhere."""
    if Path(f"/sys/module/{name}").exists():
        return "loaded"
    base = Path(f"/lib/modules/{KERNEL}")
    try:
        if any(line.rsplit("/", 1)[-1].split(".ko")[0] == name for line in (base / "modules.builtin").read_text().split()):
            return "builtin"
    except OSError:
        pass
    for where, _, files in os.walk(base):  # links (build/, source/: the headers) not followed
        for f in files:
            if f.split(".ko")[0] == name and ".ko" in f:
                return str(Path(where) / f)
    return None


def netem_in_kernel() -> tuple[bool | None, str]:
    """(whether this kernel has sch_netem, from its config and modules: None = cannot tell, why)."""
    where = kernel_module("sch_netem")
    if where:
        return True, f"sch_netem {where}" if where in ("loaded", "builtin") else f"sch_netem module {where}"
    config = kernel_config("CONFIG_NET_SCH_NETEM")
    if config in ("y", "m"):
        return True, f"CONFIG_NET_SCH_NETEM={config}"
    if config == "n":
        return False, f"kernel {KERNEL} is built without sch_netem (CONFIG_NET_SCH_NETEM is not set)"
    return None, "no kernel config to read"


QUEUE_OPTIONS = ("CONFIG_NETFILTER_NETLINK_QUEUE", "CONFIG_NETFILTER_XT_TARGET_NFQUEUE", "CONFIG_NFT_COMPAT")


def netem_queue_mode() -> tuple[bool, str]:
    """(whether network.netem's queue mode — an NFQUEUE helper, no sch_netem — can run here, in words: the
    kernel options it needs and the C compiler that builds its helper)."""
    from chaoskit.cbuild import compiler

    opts = {o: kernel_config(o) for o in QUEUE_OPTIONS}
    said = ", ".join(f"{o.removeprefix('CONFIG_')}={v or '?'}" for o, v in opts.items())
    off = [o.removeprefix("CONFIG_") for o, v in opts.items() if v == "n"]
    if off:
        return False, f"queue mode cannot run either: the kernel lacks {', '.join(off)}"
    if compiler() is None:
        return False, "queue mode cannot run either: no C compiler ($CC, cc or gcc) to build its helper"
    return True, f"mode queue (an NFQUEUE helper holds the packets; {said}, {compiler()} builds it)"


def _netem() -> Check:
    """network.netem runs where sch_netem does (mode qdisc) or, without it, in queue mode: the check passes
    with either; sch_netem is listed as missing only where neither runs."""
    area, blocks = "network.netem (kernel)", blocked("netem")
    has, why = netem_in_kernel()
    queue_ok, queue = netem_queue_mode()
    if not _is_root():
        mode = "mode qdisc" if has else queue
        return Check(area, False, f"needs root to create a test namespace; {why}; as root, network.netem would use "
                                  f"{mode}", blocks, ("root",) if has is not False or queue_ok else ("root", "netem"))
    from chaoskit.targets.tc import netem_missing_reason

    reason = netem_missing_reason()
    if reason is None:
        return Check(area, True, "sch_netem available (checked in a throwaway netns); network.netem uses mode qdisc",
                     blocks)
    said = why if has is False else reason
    if queue_ok:
        return Check(area, True, f"{said}; network.netem uses {queue} (mode: qdisc needs sch_netem)", blocks)
    return Check(area, False, f"{said}; {queue}", blocks, ("netem",) if "sch_netem" in reason else ())


def _nft() -> Check:
    from chaoskit.targets import nftables

    area, blocks = "nftables (network.drop/partition)", blocked("nftables")
    try:
        nftables.libnftables()
    except nftables.NftError as e:
        return Check(area, False, str(e), blocks, ("nftables",))
    try:
        n = len(nftables.tables("/proc/self/ns/net"))
    except (nftables.NftError, OSError) as e:
        return Check(area, False, str(e), blocks, () if _is_root() else ("root",))
    return Check(area, True, f"libnftables JSON API works ({n} tables here)", blocks)


def _cgroup_io() -> Check:
    area, blocks = "block I/O throttling", blocked("cgroup-io")
    v2 = Path("/sys/fs/cgroup/cgroup.controllers")
    unified = Path("/sys/fs/cgroup/unified/cgroup.controllers")
    for f in (v2, unified):
        if f.exists() and "io" in f.read_text().split():
            return Check(area, True, f"cgroup v2 io controller ({f.parent})", blocks)
    if Path("/sys/fs/cgroup/blkio/blkio.throttle.read_bps_device").exists():
        return Check(area, True, "cgroup v1 blkio.throttle (no v2 io controller)", blocks)
    return Check(area, False, "neither cgroup v2 io controller nor v1 blkio is mounted", blocks, ("cgroup-io",))


# ---------------------------------------------------------------- eBPF

def tracefs_mounted() -> bool:
    """tracefs is mounted at /sys/kernel/tracing (read from the mount table: its directory is root's only)."""
    try:
        mounts = Path("/proc/self/mounts").read_text().splitlines()
    except OSError:
        return False
    return any(len(f) > 2 and f[1] == str(TRACEFS) and f[2] == "tracefs" for f in (m.split() for m in mounts))


def system_bcc() -> Path | None:
    """bcc's Python module installed by the distribution, if any."""
    for pattern in SYSTEM_BCC:
        for found in sorted(glob.glob(pattern)):
            if Path(found, "__init__.py").exists():
                return Path(found)
    return None


def bcc_state() -> tuple[str | None, str]:
    """(the requirement bcc misses: None, "bcc" or "bcc-site", what was found)."""
    from chaoskit.errors import PreflightError
    from chaoskit.probes.ebpf import load_bcc

    try:
        load_bcc()
    except PreflightError as e:
        found = system_bcc()
        if found is None:
            return "bcc", str(e).removeprefix("ebpf: ")
        return "bcc-site", f"bcc is installed at {found}, but {sys.executable} cannot import it ({e})"
    import bcc

    return None, f"bcc {getattr(bcc, '__version__', '')} from {Path(bcc.__file__).parent}".replace("  ", " ")


def _ebpf() -> Check:
    import asyncio

    from chaoskit.errors import PreflightError
    from chaoskit.probes.ebpf import EbpfProbe, EbpfProbeSpec

    area = "eBPF probes (bcc)"
    missing, why = _ebpf_missing()
    if missing:
        return Check(area, False, "; ".join(why), blocked("ebpf"), tuple(missing))
    probe = EbpfProbe(EbpfProbeSpec(type="ebpf", name="doctor", program="runqueue_latency"))
    try:
        probe.preflight()  # a real compile + attach
    except PreflightError as e:
        return Check(area, False, str(e).removeprefix("ebpf: "), blocked("ebpf"))
    asyncio.run(probe.close())
    btf = "BTF present" if Path("/sys/kernel/btf/vmlinux").exists() else "no BTF (bpftrace limited)"
    return Check(area, True, f"compiled and attached a tracepoint program; {btf}; {why[0]}", blocked("ebpf"))


def _ebpf_missing() -> tuple[list[str], list[str]]:
    """What the eBPF probe lacks here (requirement ids) and what was found, each prerequisite on its own."""
    missing, why = [], []
    bcc_missing, bcc_found = bcc_state()
    if bcc_missing:
        missing.append(bcc_missing)
    why.append(bcc_found)
    if not Path(f"/lib/modules/{KERNEL}/build").exists():
        missing.append("kernel-headers")
        why.append(f"no kernel headers at /lib/modules/{KERNEL}/build")
    if not tracefs_mounted():
        missing.append("tracefs")
        why.append(f"tracefs is not mounted at {TRACEFS}")
    if not _is_root():
        missing.append("root")
        why.append("loading BPF programs needs root")
    return missing, why


# ---------------------------------------------------------------- the native load sender

def _load_sender() -> Check:
    """Whether the native sender compiles here (a real compile of sender.c in a scratch directory)."""
    from chaoskit import cbuild
    from chaoskit.errors import ChaoskitError
    from chaoskit.load import native

    area = "load sender (native)"
    blocks = blocked("native-sender")  # with load.sender: native (sender: auto falls back to the python sender)
    cc = cbuild.compiler()
    failed = compile_error(cc, native) if cc else "no C compiler ($CC, cc or gcc on PATH)"
    try:
        lib = native.build()  # the cached build when there is one
    except ChaoskitError as e:
        if failed:
            return Check(area, False, f"{failed}: the native sender cannot compile; sender auto uses the python "
                                      "sender", blocks, ("cc",))
        return Check(area, False, f"{e}; sender auto uses the python sender", blocks)
    if failed:
        return Check(area, False, f"{failed}: the native sender cannot compile; its cached build {lib} works until "
                                  "sender.c changes", blocks, ("cc",))
    return Check(area, True, f"{cc} compiles sender.c; built {lib}", blocks)


def compile_error(cc: str, native: Any) -> str | None:
    """None when `cc` compiles and links sender.c (into a scratch dir, not the cache), else its last error."""
    with tempfile.TemporaryDirectory(prefix="chaoskit-doctor-") as d:
        try:
            r = subprocess.run([cc, *native.CFLAGS, "-o", str(Path(d) / "sender.so"), str(native.SOURCE), "-lm"],
                               capture_output=True, text=True, timeout=120)
        except (OSError, subprocess.TimeoutExpired) as e:
            return f"{cc} fails: {e}"
    if r.returncode == 0:
        return None
    lines = [line for line in r.stderr.splitlines() if "error" in line] or r.stderr.splitlines() or ["?"]
    return f"{cc} fails: {lines[-1].strip()[:300]}"


# ---------------------------------------------------------------- GPUs

def nvidia_gpu_present() -> bool:
    """An NVIDIA device (PCI vendor 0x10de) on the PCI bus, or the driver's device nodes."""
    for vendor in glob.glob("/sys/bus/pci/devices/*/vendor"):
        try:
            if Path(vendor).read_text().strip() == "0x10de":
                return True
        except OSError:
            continue
    return Path("/dev/nvidiactl").exists()


def _gpu_missing() -> tuple[str, ...]:
    return ("nvidia-driver",) if nvidia_gpu_present() else ("nvidia-gpu", "nvidia-driver")


def _cuda() -> Check:
    from chaoskit.errors import PreflightError
    from chaoskit.gpu.cuda import Driver, library_path

    area, blocks = "GPU memory pressure (CUDA driver)", blocked("cuda")
    try:
        drv = Driver()
        n = drv.device_count()
    except PreflightError as e:
        return Check(area, False, str(e), blocks, _gpu_missing())
    return Check(area, n > 0, f"{library_path()} loaded, {n} CUDA device(s)", blocks, () if n else _gpu_missing())


def _nvml() -> Check:
    from chaoskit.errors import PreflightError
    from chaoskit.gpu import nvml
    from chaoskit.units import format_size

    area = "GPU (NVML: nvml probe, gpu.mig)"
    try:
        devs = nvml.devices()
    except PreflightError as e:
        return Check(area, False, str(e), blocked("nvml"), _gpu_missing())
    mig = {True: "MIG enabled", False: "MIG capable, disabled"}
    rows = [f"{d.index}: {d.name} {d.uuid} {format_size(d.memory_total)} {d.pci_bus_id} "
            + (mig[bool(d.mig_current)] + (" (change pending)" if d.mig_pending != d.mig_current else "")
               if d.mig_capable else "not MIG-capable") for d in devs]
    return Check(area, bool(devs), "; ".join(rows) or "NVML sees no GPU", blocked("nvml"), () if devs else _gpu_missing())


def _kmsg() -> Check:
    ok = os.access("/dev/kmsg", os.W_OK)
    return Check("kernel log (gpu.xid, kernel_log)", ok and os.access("/dev/kmsg", os.R_OK),
                 "/dev/kmsg readable and writable" if ok else "/dev/kmsg not writable (gpu.xid needs root)",
                 blocked("kmsg"), () if ok or _is_root() else ("root",))


def _kube() -> Check:
    blocks = blocked("kube")
    if os.environ.get("KUBERNETES_SERVICE_HOST"):
        return Check("Kubernetes", True, "in-cluster service account", blocks)
    cfg = Path(os.environ.get("KUBECONFIG", Path.home() / ".kube" / "config"))
    return Check("Kubernetes", cfg.exists(), f"kubeconfig {cfg}" if cfg.exists() else "no kubeconfig, not in a pod",
                 blocks, () if cfg.exists() else ("kubeconfig",))


CHECKS: tuple[Callable[[], Check], ...] = (_root, _watchdog, _process, _memory, _netem, _nft, _cgroup_io, _ebpf,
                                         _load_sender, _cuda, _nvml, _kmsg, _kube)


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
