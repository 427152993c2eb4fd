"""ebpf probe: the bundled bcc programs (bpf/, chaoskit.library.bpf) on kernel tracepoints, compiled once per run (in preflight) and kept
attached; each sample reports the window since the last one (histograms: running per-CPU totals, differenced)."""

from __future__ import annotations

import ctypes
import ipaddress
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, ClassVar, Literal

from pydantic import Field, model_validator

from chaoskit.errors import PreflightError
from chaoskit.paths import library
from chaoskit.probes.base import Probe, ProbeSpecBase
from chaoskit.probes.btf_programs import BtfTracepoints
from chaoskit.probes.kernel_btf import VMLINUX, KernelBtf

BCC_PATH = "/usr/lib/python3/dist-packages"
TRACEFS = Path("/sys/kernel/tracing")
PROGRAMS = ("tcp_retransmits", "tcp_connect_latency", "oom_kills", "block_io_latency", "runqueue_latency")
HISTOGRAMS = ("tcp_connect_latency", "block_io_latency", "runqueue_latency")
# The hot programs are BTF raw tracepoints (bpf/tp_btf.h), which get the kernel's own arguments rather than a
# copied record: the members they read (macro: struct, member, size), at offsets from the running kernel's
# BTF, and the arguments they take (event, index, type), checked against it.
MEMBERS: dict[str, dict[str, tuple[str, str, int]]] = {
    "runqueue_latency": {"TASK_PID": ("task_struct", "pid", 4),
                         "TASK_LAST_QUEUED": ("task_struct", "sched_info.last_queued", 8),
                         "TASK_CFS_RQ": ("task_struct", "se.cfs_rq", 8), "CFS_RQ_RQ": ("cfs_rq", "rq", 8),
                         "RQ_CLOCK": ("rq", "clock", 8)},
    "tcp_connect_latency": {"SK_PROTOCOL": ("sock", "sk_protocol", 2), "SK_DPORT": ("sock", "__sk_common.skc_dport", 2)},
    "block_io_latency": {"RQ_Q": ("request", "q", 8), "Q_DISK": ("request_queue", "disk", 8),
                         "DISK_MAJOR": ("gendisk", "major", 4), "DISK_FIRST_MINOR": ("gendisk", "first_minor", 4),
                         "RQ_START_TIME_NS": ("request", "start_time_ns", 8)},
}
# What the netns filter reads (bpf/netns.h): a socket's network namespace, and that namespace's inode number.
NETNS_MEMBERS = {"SK_NET": ("sock", "__sk_common.skc_net.net", 8), "NET_INUM": ("net", "ns.inum", 4)}
RAW_ARGS: dict[str, tuple[tuple[str, int, str], ...]] = {
    "runqueue_latency": (("sched_switch", 2, "struct task_struct *"),),
    "tcp_connect_latency": (("inet_sock_set_state", 0, "struct sock *"), ("inet_sock_set_state", 1, "int"),
                            ("inet_sock_set_state", 2, "int")),
    "block_io_latency": (("block_rq_issue", 0, "struct request *"), ("block_rq_complete", 0, "struct request *")),
}


def bpf_dir() -> Path:
    """The bcc sources: $CHAOSKIT_BPF_DIR, else the package's own (library("bpf"))."""
    env = os.environ.get("CHAOSKIT_BPF_DIR")
    return Path(env) if env else library("bpf")


class EbpfProbeSpec(ProbeSpecBase):
    type: Literal["ebpf"]
    program: Literal["tcp_retransmits", "tcp_connect_latency", "oom_kills", "block_io_latency", "runqueue_latency"]
    pid: int | None = Field(None, gt=0, description="connect latency: connects by this process; runqueue: its "
                                                    "threads; oom_kills: victims in its process tree")
    netns: str | None = Field(None, min_length=1, description="tcp_*: only sockets in this network namespace "
                                                              "(a name in /run/netns, or a path such as "
                                                              "/proc/PID/ns/net)")
    port: int | None = Field(None, gt=0, lt=65536, description="tcp_retransmits: source or destination port; "
                                                               "tcp_connect_latency: destination port")
    device: str | None = Field(None, min_length=1, description="block_io_latency: a block device, a path on it, "
                                                               "or MAJOR:MINOR")
    cgroup: str | None = Field(None, min_length=1, description="cgroup v2 path (absolute, or relative to the v2 "
                                                               "root): connects, block I/O issued, or OOMs from it")
    expect_keys: ClassVar[tuple[str, ...]] = ("count", "rate", "p50_us", "p90_us", "p99_us", "max_us", "mean_us",
                                              "victims", "last_victim_pid", "top_destination")

    @model_validator(mode="after")
    def _filters(self) -> EbpfProbeSpec:
        allowed = {"tcp_retransmits": {"netns", "port"}, "tcp_connect_latency": {"netns", "port", "pid", "cgroup"},
                   "oom_kills": {"pid", "cgroup"}, "block_io_latency": {"device", "cgroup"},
                   "runqueue_latency": {"pid"}}[self.program]
        for f in ("pid", "netns", "port", "device", "cgroup"):
            if getattr(self, f) is not None and f not in allowed:
                raise ValueError(f"{f} does not filter {self.program} (it takes: {', '.join(sorted(allowed))})")
        return self


def bucket_value(b: int) -> float:
    """Midpoint of a log-linear bucket (bpf/hist.h)."""
    if b < 8:
        return float(b)
    lg, sub = divmod(b, 8)
    width = 1 << (lg - 3)
    return float(((8 + sub) << (lg - 3)) + width / 2)


def hist_values(counts: dict[int, int]) -> dict[str, Any]:
    total = sum(counts.values())
    out: dict[str, Any] = {"count": total}
    if not total:
        return out
    ordered = sorted(counts.items())
    for name, q in (("p50_us", 0.5), ("p90_us", 0.9), ("p99_us", 0.99)):
        seen = 0
        for b, n in ordered:
            seen += n
            if seen >= q * total:
                out[name] = bucket_value(b)
                break
    out["max_us"] = bucket_value(ordered[-1][0])
    out["mean_us"] = round(sum(bucket_value(b) * n for b, n in ordered) / total, 1)
    return out


def members(spec: EbpfProbeSpec) -> dict[str, tuple[str, str, int]]:
    """The kernel struct members the program reads with these filters (macro: struct, member, size)."""
    return MEMBERS.get(spec.program, {}) | (NETNS_MEMBERS if spec.netns is not None else {})


def kernel_btf(spec: EbpfProbeSpec) -> KernelBtf | None:
    """The running kernel's BTF, for a program that reads kernel structs (None for the others)."""
    if not members(spec):
        return None
    if not VMLINUX.exists():
        raise PreflightError(f"ebpf: {spec.program} needs the kernel's BTF at {VMLINUX} (CONFIG_DEBUG_INFO_BTF)")
    return KernelBtf.load()


def layout_flags(spec: EbpfProbeSpec, btf: KernelBtf) -> list[str]:
    """-D flags with the kernel layout the program reads; PreflightError if it is not as expected."""
    flags = []
    try:
        for event, index, want in RAW_ARGS.get(spec.program, ()):
            args = btf.tracepoint_args(event)
            if len(args) <= index or args[index] != want:
                raise LookupError(f"raw tracepoint {event} takes ({', '.join(args)}), argument {index} is not {want}")
        for macro, (struct_name, path, size) in members(spec).items():
            offset, got = btf.member(struct_name, path)
            if got != size:
                raise LookupError(f"{struct_name}.{path} is {got} bytes, not {size}")
            flags.append(f"-D{macro}={offset}")
    except LookupError as e:
        raise PreflightError(f"ebpf: {spec.program} does not fit this kernel: {e}") from None
    return flags


def program_text(source: Path) -> str:
    """The program with our own `#include "x.h"` lines replaced by the header: bcc turns map calls into BPF
    only in the file it compiles, and pending.h makes them."""
    lines = []
    for line in source.read_text().splitlines():
        name = line.removeprefix('#include "').removesuffix('"')
        header = source.parent / name
        lines.append(header.read_text() if name != line and header.exists() else line)
    return "\n".join(lines) + "\n"


def percpu_totals(table: Any) -> dict[int, int]:
    """{key: sum over CPUs} of the non-zero entries of a bcc per-CPU array of u64, in one BPF_MAP_LOOKUP_BATCH."""
    from bcc import lib

    size, cpus = table.max_entries, table.total_cpu
    keys, values = (ctypes.c_uint32 * size)(), (ctypes.c_uint64 * (size * cpus))()
    count, next_key = ctypes.c_uint32(size), ctypes.c_uint32(0)
    if lib.bpf_lookup_batch(table.map_fd, None, ctypes.byref(next_key), keys, values, ctypes.byref(count)) != 0:
        errno = ctypes.get_errno()
        if errno != 2:  # ENOENT: the end was reached, and count says how far
            raise OSError(errno, f"BPF_MAP_LOOKUP_BATCH: {os.strerror(errno)}")
    out: dict[int, int] = {}
    for i, n in enumerate(memoryview(values).cast("B").cast("Q")[:count.value * cpus]):
        if n:  # most buckets are empty
            out[keys[i // cpus]] = out.get(keys[i // cpus], 0) + n
    return out


def kernel_dev(spec: str) -> int:
    """The kernel's dev_t (major << 20 | minor) of a device, a path on it, or MAJOR:MINOR."""
    if ":" in spec and not os.path.exists(spec):
        major, minor = (int(x) for x in spec.split(":"))
    else:
        st = os.stat(spec)
        rdev = st.st_rdev if st.st_rdev else st.st_dev
        major, minor = os.major(rdev), os.minor(rdev)
    return (major << 20) | minor


def cgroup_v2_id(path: str) -> int:
    """The cgroup v2 id (the inode of its directory in the cgroup2 filesystem) of a path."""
    roots = [Path("/sys/fs/cgroup"), Path("/sys/fs/cgroup/unified")]
    root = next((r for r in roots if (r / "cgroup.controllers").exists()), None)
    if root is None:
        raise PreflightError("ebpf: no cgroup v2 hierarchy mounted for the cgroup filter")
    p = Path(path)
    full = p if p.is_absolute() and p.is_relative_to(root) else root / str(path).lstrip("/")
    if not (full / "cgroup.procs").exists():
        raise PreflightError(f"ebpf: {full} is not a cgroup v2 directory")
    return full.stat().st_ino


def netns_inode(ns: str) -> int:
    """The inode number of a network namespace (a name in /run/netns, or a path), the kernel's net->ns.inum."""
    from chaoskit.targets.netns import netns_path, ns_inode

    return ns_inode(netns_path(ns))


def process_tree(pid: int) -> set[int]:
    """pid, its threads, and its descendants' threads."""
    from chaoskit.targets.process import all_pids, parent_pid

    tree = {pid}
    changed = True
    pids = all_pids()
    while changed:
        changed = False
        for p in pids:
            if p not in tree and parent_pid(p) in tree:
                tree.add(p)
                changed = True
    tids = set()
    for p in tree:
        try:
            tids.update(int(t) for t in os.listdir(f"/proc/{p}/task"))
        except OSError:
            pass
    return tids | tree


def load_bcc():
    if BCC_PATH not in sys.path:
        sys.path.append(BCC_PATH)
    try:
        from bcc import BPF
    except ImportError as e:
        raise PreflightError(f"ebpf: bcc is not importable ({e}); apt install python3-bpfcc") from None
    return BPF


class EbpfProbe(Probe):
    type: ClassVar[str] = "ebpf"
    host_needs: ClassVar[frozenset[str]] = frozenset({"root", "ebpf"})
    summary: ClassVar[str] = "kernel tracepoints via bcc: retransmits, connect latency, OOM kills, block I/O and " \
                             "run-queue latency"
    Spec = EbpfProbeSpec
    spec: EbpfProbeSpec

    def __init__(self, spec: EbpfProbeSpec):
        super().__init__(spec)
        self.bpf: Any = None
        self.window_start = 0.0
        self.victims: list[dict[str, Any]] = []
        self.totals: dict[int, int] = {}  # histograms: per-bucket totals at the last sample
        self.btf_programs = BtfTracepoints()
        self.tracepoints: list[bytes] = []  # the classic ones bcc attached

    # ---------------------------------------------------------------- compile and attach (once)

    def cflags(self, btf: KernelBtf | None = None) -> list[str]:
        s = self.spec
        flags = [f"-I{bpf_dir()}",
                 f"-DFILTER_NETNS={int(s.netns is not None)}", f"-DFILTER_PIDS={int(s.pid is not None)}",
                 f"-DFILTER_DPORT={s.port or 0}", f"-DFILTER_PORT={s.port or 0}",
                 f"-DFILTER_DEV={kernel_dev(s.device) if s.device else 0}",
                 f"-DFILTER_CGROUP={cgroup_v2_id(s.cgroup) if s.cgroup else 0}ULL"]
        return flags + (layout_flags(s, btf) if btf else [])

    def preflight(self) -> None:
        if os.geteuid() != 0:
            raise PreflightError("ebpf: loading BPF programs needs root")
        if not (TRACEFS / "events").is_dir():
            raise PreflightError("ebpf: tracefs is not mounted (mount -t tracefs nodev /sys/kernel/tracing)")
        if not Path(f"/lib/modules/{os.uname().release}/build").exists():
            raise PreflightError(f"ebpf: no kernel headers at /lib/modules/{os.uname().release}/build "
                                 "(make setup links Debian's linux-headers-amd64)")
        source = bpf_dir() / f"{self.spec.program}.c"
        if not source.exists():
            raise PreflightError(f"ebpf: {source} not found")
        if self.spec.device:
            try:
                kernel_dev(self.spec.device)
            except (OSError, ValueError) as e:
                raise PreflightError(f"ebpf: device {self.spec.device}: {e}") from None
        if self.spec.netns:
            try:
                netns_inode(self.spec.netns)
            except OSError as e:
                raise PreflightError(f"ebpf: network namespace {self.spec.netns}: {e.strerror}") from None
        btf = kernel_btf(self.spec)
        self._compile(source, btf)
        if btf is not None:
            try:
                self.btf_programs = BtfTracepoints.load_all(self.bpf, btf)
                self.btf_programs.attach()
            except OSError as e:
                raise PreflightError(f"ebpf: {self.spec.program} does not load here: {e}") from None
        self.tracepoints = sorted(self.bpf.tracepoint_fds)
        if self.spec.program == "oom_kills":
            self.bpf[b"victims"].open_perf_buffer(self._on_victim)
        self._refresh_filters()
        self.window_start = time.monotonic()

    def _compile(self, source: Path, btf: KernelBtf | None) -> None:
        """bcc compiles the program, creates its maps and attaches its classic tracepoint functions."""
        BPF = load_bcc()
        with tempfile.TemporaryFile() as errors:  # clang writes its diagnostics to fd 2: capture them
            saved = os.dup(2)
            os.dup2(errors.fileno(), 2)
            try:
                self.bpf = BPF(text=program_text(source).encode(), cflags=self.cflags(btf))
                failure = None
            except Exception as e:
                failure = e
            finally:
                os.dup2(saved, 2)
                os.close(saved)
            if failure is not None:
                errors.seek(0)
                detail = " ".join(line for line in errors.read().decode(errors="replace").splitlines()
                                  if "error" in line)[:800]
                raise PreflightError(f"ebpf: {self.spec.program} does not compile here: {failure}"
                                     + (f": {detail}" if detail else "")) from None

    def detach(self) -> None:
        """Take the programs off their tracepoints; they stay loaded, and attach() puts them back."""
        for tp in self.tracepoints:
            self.bpf.detach_tracepoint(tp)
        self.btf_programs.detach()

    def attach(self) -> None:
        for tp in self.tracepoints:  # TRACEPOINT_PROBE(cat, event) defines tracepoint__cat__event
            self.bpf.attach_tracepoint(tp=tp, fn_name=b"tracepoint__" + tp.replace(b":", b"__"))
        self.btf_programs.attach()

    def _on_victim(self, _cpu: int, data: Any, _size: int) -> None:
        v = self.bpf[b"victims"].event(data)
        self.victims.append({"pid": v.pid, "comm": v.comm.decode(errors="replace"), "uid": v.uid,
                             "anon_rss_kib": v.anon_rss_pages * 4, "cgroup_id": v.cgroup_id})

    def _refresh_filters(self) -> None:
        s = self.spec
        if s.netns is not None:  # (a namespace made again under the same name is followed)
            self.bpf[b"netns"][ctypes.c_int(0)] = ctypes.c_uint32(netns_inode(s.netns))
        if s.pid is not None and s.program in ("tcp_connect_latency", "runqueue_latency"):
            m = self.bpf[b"pids"]
            m.clear()
            for p in process_tree(s.pid):
                m[ctypes.c_uint32(p)] = ctypes.c_uint8(1)

    # ---------------------------------------------------------------- one window

    async def measure(self) -> dict[str, Any]:
        if self.bpf is None:
            self.preflight()
        now = time.monotonic()
        window = max(now - self.window_start, 1e-6)
        self.window_start = now
        program = self.spec.program
        if program in HISTOGRAMS:
            out = hist_values(self._window_counts())
        elif program == "tcp_retransmits":
            per: dict[str, int] = {}
            for k, v in self.bpf[b"counts"].items():
                dest = f"{ipaddress.IPv4Address(k.daddr.to_bytes(4, 'little'))}:{k.dport}"
                per[dest] = per.get(dest, 0) + v.value
            self.bpf[b"counts"].clear()
            out = {"count": sum(per.values()),
                   "top_destination": max(per, key=per.__getitem__) if per else ""}
        else:  # oom_kills
            self.bpf.perf_buffer_poll(timeout=0)
            tree = process_tree(self.spec.pid) if self.spec.pid else None
            cg = cgroup_v2_id(self.spec.cgroup) if self.spec.cgroup else None
            got = [v for v in self.victims if (tree is None or v["pid"] in tree) and (cg is None or v["cgroup_id"] == cg)]
            self.victims = []
            out = {"count": len(got), "victims": "; ".join(f"{v['pid']} {v['comm']}" for v in got),
                   "last_victim_pid": got[-1]["pid"] if got else 0}
        out["rate"] = round(out["count"] / window, 3)
        self._refresh_filters()
        return out

    def _window_counts(self) -> dict[int, int]:
        """Per-bucket counts since the last sample: the running totals of the per-CPU histogram (read in one
        batch), less those of the last sample."""
        totals = percpu_totals(self.bpf[b"hist"])
        counts = {b: n - self.totals.get(b, 0) for b, n in totals.items() if n > self.totals.get(b, 0)}
        self.totals = totals
        return counts

    async def close(self) -> None:
        self.btf_programs.close()
        if self.bpf is not None:
            self.bpf.cleanup()
            self.bpf = None
