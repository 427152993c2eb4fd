"""cgroup hierarchies (v2, or a controller's v1 mount): membership, moves and the io/blkio, cpu and memory limits."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar, Self

from chaoskit.errors import PreflightError
from chaoskit.targets.blockdev import mounts

LIMIT_KEYS = ("rbps", "wbps", "riops", "wiops")
V1_FILES = {"rbps": "blkio.throttle.read_bps_device", "wbps": "blkio.throttle.write_bps_device",
            "riops": "blkio.throttle.read_iops_device", "wiops": "blkio.throttle.write_iops_device"}


@dataclass(frozen=True)
class Hierarchy:
    """One controller's cgroup hierarchy: `version` 2 (unified) or 1 (the controller's own mount), rooted at
    `root`. Which cgroup a process or thread is in, moving it, and v2's turning the controller on for children;
    the limit files are the subclasses'."""

    version: int
    root: Path
    controller: ClassVar[str]  # the v2 name (cgroup.controllers, cgroup.subtree_control)
    v1_controller: ClassVar[str]  # the v1 mount option and /proc/PID/cgroup name

    def to_json(self) -> dict:
        return {"version": self.version, "root": str(self.root)}

    @classmethod
    def from_json(cls, d: dict) -> Self:
        return cls(int(d["version"]), Path(d["root"]))

    @classmethod
    def find(cls, mountinfo: Path) -> Self | None:
        """cgroup v2 where its cgroup.controllers has the controller, else a v1 mount with it; None if neither."""
        all_mounts = mounts(mountinfo)
        for mp, fstype, _, _ in all_mounts:
            if fstype == "cgroup2" and cls.controller in _read(Path(mp) / "cgroup.controllers").split():
                return cls(2, Path(mp))
        for mp, fstype, _, opts in all_mounts:
            if fstype == "cgroup" and cls.v1_controller in opts:
                return cls(1, Path(mp))
        return None

    # -- membership --------------------------------------------------------------------------------
    def cgroup_of(self, pid: int, tid: int | None = None) -> Path | None:
        """The cgroup of process `pid` (or of its thread `tid`) in this hierarchy; None if it is gone."""
        text = _read(Path(f"/proc/{pid}/task/{tid}/cgroup") if tid else Path(f"/proc/{pid}/cgroup"))
        if not text:
            return None
        for line in text.splitlines():
            hid, controllers, rel = line.split(":", 2)
            ours = hid == "0" if self.version == 2 else self.v1_controller in controllers.split(",")
            if ours:
                return self.root / rel.lstrip("/")
        raise self._not_found(pid)

    def _not_found(self, pid: int) -> PreflightError:
        return PreflightError(f"PID {pid}: not found in the {'v2' if self.version == 2 else self.v1_controller} "
                              "hierarchy")

    def tasks(self, cgroup: Path) -> list[int]:
        """Every thread (task id) in `cgroup`."""
        return [int(x) for x in _read(cgroup / ("cgroup.threads" if self.version == 2 else "tasks")).split()]

    def move_task(self, pid: int, tid: int, cgroup: Path) -> None:
        """Move one thread (v1 `tasks`); v2 domain cgroups hold whole processes, so there it moves `pid`."""
        if self.version == 2:
            self.move(pid, cgroup)
        else:
            (cgroup / "tasks").write_text(f"{tid}\n")

    @staticmethod
    def move(pid: int, cgroup: Path) -> None:
        """Move process `pid` with all its threads (`cgroup.procs`, v1 and v2)."""
        (cgroup / "cgroup.procs").write_text(f"{pid}\n")

    @staticmethod
    def procs(cgroup: Path) -> list[int]:
        return [int(x) for x in _read(cgroup / "cgroup.procs").split()]

    # -- v2: the controller in a parent's cgroup.subtree_control --------------------------------------
    def enabled_in(self, parent: Path) -> bool:
        return self.controller in (parent / "cgroup.subtree_control").read_text().split()

    def enable_in(self, parent: Path) -> None:
        if not self.enabled_in(parent):
            (parent / "cgroup.subtree_control").write_text(f"+{self.controller}\n")

    def disable_if_unused(self, parent: Path) -> None:
        """Undo the +controller chaoskit enabled, unless a child cgroup now has a limit of its own (someone
        else's)."""
        if not self.enabled_in(parent):
            return
        for child in parent.iterdir():
            if child.is_dir() and self.has_own_limit(child):
                return
        (parent / "cgroup.subtree_control").write_text(f"-{self.controller}\n")

    def has_own_limit(self, cgroup: Path) -> bool:
        """Whether v2 `cgroup` has a limit of this controller set."""
        raise NotImplementedError


class IoHierarchy(Hierarchy):
    """Where block limits are written: `version` 2 (io.max) or 1 (blkio), rooted at `root`."""

    controller: ClassVar[str] = "io"
    v1_controller: ClassVar[str] = "blkio"

    # -- limits ------------------------------------------------------------------------------------
    def read_limits(self, cgroup: Path, dev: str) -> dict[str, str]:
        """Current limits of `dev` in `cgroup` as strings ('max' / '0' mean none)."""
        if self.version == 2:
            for line in _read(cgroup / "io.max").splitlines():
                parts = line.split()
                if parts and parts[0] == dev:
                    return dict(kv.split("=", 1) for kv in parts[1:])
            return {k: "max" for k in LIMIT_KEYS}
        out = {}
        for key, fname in V1_FILES.items():
            out[key] = "0"
            for line in _read(cgroup / fname).splitlines():
                parts = line.split()
                if len(parts) == 2 and parts[0] == dev:
                    out[key] = parts[1]
        return out

    def write_limits(self, cgroup: Path, dev: str, limits: dict[str, str]) -> None:
        if self.version == 2:
            line = dev + "".join(f" {k}={v}" for k, v in limits.items())
            (cgroup / "io.max").write_text(line + "\n")
            return
        for key, value in limits.items():
            (cgroup / V1_FILES[key]).write_text(f"{dev} {value}\n")

    def unlimited(self) -> str:
        return "max" if self.version == 2 else "0"

    def has_own_limit(self, cgroup: Path) -> bool:
        io_max = cgroup / "io.max"
        return io_max.exists() and bool(io_max.read_text().strip())

    def cgroup_of(self, pid: int, tid: int | None = None) -> Path:
        """The cgroup directory of `pid` in this hierarchy; PreflightError if it is gone."""
        cgroup = super().cgroup_of(pid, tid)
        if cgroup is None:
            raise self._not_found(pid)
        return cgroup


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:  # gone (ENOENT), or its task exited while it was read (ESRCH)
        return ""


def _write_either_order(cgroup: Path, items: list[tuple[str, str]]) -> None:
    """Write limit files that constrain each other (v1 memory+swap may never be below memory): one order fails
    when the limits go up, the other when they go down, so try both; the first order's error if both fail."""
    first: OSError | None = None
    for order in (items, items[::-1]):
        try:
            for name, text in order:
                (cgroup / name).write_text(f"{text}\n")
            return
        except OSError as e:
            first = first or e
    assert first is not None
    raise first


def find_io_hierarchy(mountinfo: Path = Path("/proc/self/mountinfo")) -> IoHierarchy:
    """Prefer cgroup v2 with the io controller; fall back to v1 blkio; PreflightError if neither."""
    if hier := IoHierarchy.find(mountinfo):
        return hier
    raise PreflightError("block I/O throttling needs the cgroup v2 io controller or a v1 blkio hierarchy; "
                         "neither is mounted here")


def hierarchy_roots(mountinfo: Path = Path("/proc/self/mountinfo")) -> list[Path]:
    """The root directory of every mounted cgroup hierarchy (v1 controllers, named v1, v2), each once."""
    seen: dict[tuple[str, ...], Path] = {}
    for mp, fstype, _, opts in mounts(mountinfo):
        if fstype == "cgroup2":
            seen.setdefault(("cgroup2",), Path(mp))
        elif fstype == "cgroup":
            key = tuple(sorted(o for o in opts if o not in ("rw", "ro", "relatime", "nosuid", "nodev", "noexec")))
            seen.setdefault(key, Path(mp))
    return list(seen.values())


def escape_to_roots(pid: int) -> tuple[list[str], list[str]]:
    """Move `pid` into the root cgroup of every hierarchy, out of the cgroups of the job that started it
    (what CI runners, systemd and Kubernetes kill on cancel). Returns (moved, problems) as readable lines."""
    moved, problems = [], []
    for root in hierarchy_roots():
        try:
            IoHierarchy.move(pid, root)
            moved.append(str(root))
        except OSError as e:
            problems.append(f"{root}: {e.strerror or e}")
    return moved, problems


def cgroups_of(pid: int) -> list[str]:
    """/proc/PID/cgroup lines (hierarchy:controllers:path), for the journal and tests."""
    return _read(Path(f"/proc/{pid}/cgroup")).split()


# -- CPU bandwidth (process.cpu_throttle) ------------------------------------------------------------
class CpuHierarchy(Hierarchy):
    """Where CPU bandwidth limits are written: `version` 2 (`cpu.max`) or 1 (`cpu.cfs_quota_us` and
    `cpu.cfs_period_us`), rooted at `root`. Quotas and periods are in microseconds; quota None = unlimited."""

    controller: ClassVar[str] = "cpu"
    v1_controller: ClassVar[str] = "cpu"

    def read_limit(self, cgroup: Path) -> tuple[int | None, int]:
        """(quota, period) of `cgroup`; period 0 when the cgroup is gone."""
        if self.version == 2:
            parts = _read(cgroup / "cpu.max").split()
            if len(parts) != 2:
                return None, 0
            return (None if parts[0] == "max" else int(parts[0])), int(parts[1])
        quota, period = _read(cgroup / "cpu.cfs_quota_us").strip(), _read(cgroup / "cpu.cfs_period_us").strip()
        if not quota or not period:
            return None, 0
        return (None if int(quota) < 0 else int(quota)), int(period)

    def write_limit(self, cgroup: Path, quota: int | None, period: int) -> None:
        if self.version == 2:
            (cgroup / "cpu.max").write_text(f"{'max' if quota is None else quota} {period}\n")
            return
        (cgroup / "cpu.cfs_period_us").write_text(f"{period}\n")  # period first: the quota is checked against it
        (cgroup / "cpu.cfs_quota_us").write_text(f"{-1 if quota is None else quota}\n")

    def stat(self, cgroup: Path) -> dict[str, int]:
        """cpu.stat (nr_periods, nr_throttled, throttled time ...) as integers."""
        out = {}
        for line in _read(cgroup / "cpu.stat").splitlines():
            key, _, value = line.partition(" ")
            if value.strip().isdigit():
                out[key] = int(value)
        return out

    def has_own_limit(self, cgroup: Path) -> bool:
        cpu_max = cgroup / "cpu.max"
        return cpu_max.exists() and not cpu_max.read_text().startswith("max ")


def find_cpu_hierarchy(mountinfo: Path = Path("/proc/self/mountinfo")) -> CpuHierarchy:
    """Prefer cgroup v2 with the cpu controller; fall back to a v1 hierarchy with cpu; PreflightError if neither."""
    if hier := CpuHierarchy.find(mountinfo):
        return hier
    raise PreflightError("CPU throttling needs the cgroup v2 cpu controller or a v1 cpu hierarchy; neither is "
                         "mounted here (/proc/self/mountinfo has no cgroup2 with cpu in cgroup.controllers and no "
                         "cgroup mount with the cpu option)")


# -- memory (process.memory_limit) --------------------------------------------------------------------
UNLIMITED_V1 = 1 << 62  # v1 reports "no limit" as PAGE_COUNTER_MAX pages (9223372036854771712 with 4 KiB pages)


class MemHierarchy(Hierarchy):
    """Where memory limits are written: `version` 2 (`memory.max`, `memory.current`, `memory.events`) or 1
    (`memory.limit_in_bytes`, `memory.usage_in_bytes`, `memory.failcnt`, `memory.oom_control`), rooted at
    `root`. Sizes are bytes; a limit of None = unlimited."""

    controller: ClassVar[str] = "memory"
    v1_controller: ClassVar[str] = "memory"

    def _file(self, v2: str, v1: str) -> str:
        return v2 if self.version == 2 else v1

    def usage(self, cgroup: Path) -> int | None:
        """Bytes charged to `cgroup` now; None when it is gone."""
        text = _read(cgroup / self._file("memory.current", "memory.usage_in_bytes")).strip()
        return int(text) if text.isdigit() else None

    def peak(self, cgroup: Path) -> int | None:
        """The most ever charged to `cgroup` (v2 `memory.peak` where the kernel has it); None if unknown."""
        text = _read(cgroup / self._file("memory.peak", "memory.max_usage_in_bytes")).strip()
        return int(text) if text.isdigit() else None

    def read_limit(self, cgroup: Path) -> int | None:
        """The limit of `cgroup` in bytes; None = unlimited (or the cgroup is gone)."""
        text = _read(cgroup / self._file("memory.max", "memory.limit_in_bytes")).strip()
        if not text.isdigit():
            return None
        n = int(text)
        return None if self.version == 1 and n >= UNLIMITED_V1 else n

    def write_limit(self, cgroup: Path, nbytes: int) -> None:
        """Set the limit. v1 also sets `memory.memsw.limit_in_bytes` (memory + swap) where swap is accounted,
        so swap cannot absorb what the limit is meant to refuse (memory first when lowering, memsw first when
        raising an existing cgroup's limit)."""
        if self.version == 2:
            (cgroup / "memory.max").write_text(f"{nbytes}\n")
            swap = cgroup / "memory.swap.max"
            if swap.exists():
                swap.write_text("0\n")
            return
        names = [n for n in ("memory.limit_in_bytes", "memory.memsw.limit_in_bytes") if (cgroup / n).exists()]
        _write_either_order(cgroup, [(n, str(nbytes)) for n in names])

    def limit_files(self, cgroup: Path) -> dict[str, str]:
        """The text of every limit file write_limit changes that `cgroup` has, to put back with restore_limits."""
        names = ("memory.max", "memory.swap.max") if self.version == 2 else ("memory.limit_in_bytes",
                                                                             "memory.memsw.limit_in_bytes")
        return {n: _read(cgroup / n).strip() for n in names if (cgroup / n).exists()}

    def restore_limits(self, cgroup: Path, saved: dict[str, str]) -> None:
        """Write back what limit_files read."""
        _write_either_order(cgroup, [(n, t) for n, t in saved.items() if (cgroup / n).exists()])

    def move_charges_on_immigrate(self, cgroup: Path) -> bool:
        """v1: ask the kernel to move a task's existing charges with it into `cgroup`
        (`memory.move_charge_at_immigrate` = 3: anonymous and file pages). False where it cannot: v2 never
        moves charges, and newer kernels refuse the v1 knob (EINVAL)."""
        if self.version == 2:
            return False
        try:
            (cgroup / "memory.move_charge_at_immigrate").write_text("3\n")
        except OSError:
            return False
        return _read(cgroup / "memory.move_charge_at_immigrate").strip() == "3"

    def events(self, cgroup: Path) -> dict[str, int]:
        """OOM and limit counters: v2 `memory.events` (max, oom, oom_kill ...); v1 `failcnt` and `memsw_failcnt`
        (times a charge hit the memory / memory+swap limit) and `memory.oom_control`'s `under_oom` and `oom_kill`
        (where the kernel has it)."""
        out: dict[str, int] = {}
        names = ["memory.events"] if self.version == 2 else ["memory.oom_control"]
        for name in names:
            for line in _read(cgroup / name).splitlines():
                key, _, value = line.partition(" ")
                if value.strip().isdigit():
                    out[key] = int(value)
        if self.version == 1:  # with memsw limited too, the kernel charges (and fails) memory+swap first
            for key, name in (("failcnt", "memory.failcnt"), ("memsw_failcnt", "memory.memsw.failcnt")):
                text = _read(cgroup / name).strip()
                if text.isdigit():
                    out[key] = int(text)
        return out

    def force_empty(self, cgroup: Path) -> None:
        """v1: reclaim what an emptied cgroup still has charged (helps a removal that the kernel reports busy)."""
        if self.version == 1:
            try:
                (cgroup / "memory.force_empty").write_text("0\n")
            except OSError:
                pass

    def has_own_limit(self, cgroup: Path) -> bool:
        limit = cgroup / "memory.max"
        return limit.exists() and limit.read_text().strip() != "max"


def find_mem_hierarchy(mountinfo: Path = Path("/proc/self/mountinfo")) -> MemHierarchy:
    """Prefer cgroup v2 with the memory controller; fall back to a v1 memory hierarchy; PreflightError if
    neither."""
    if hier := MemHierarchy.find(mountinfo):
        return hier
    raise PreflightError("memory limits need the cgroup v2 memory controller or a v1 memory hierarchy; neither "
                         "is mounted here (/proc/self/mountinfo has no cgroup2 with memory in cgroup.controllers "
                         "and no cgroup mount with the memory option)")
