"""Block I/O limits through cgroups: v2 `io.max` where the io controller exists, else v1 `blkio.throttle.*`."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from chaoskit.errors import PreflightError
from chaoskit.targets.blockdev import mounts

LIMIT_KEYS = ("rbps", "wbps", "riops", "wiops")
V1_FILES = {"rbps": "blkio.throttle.read_bps_device", "wbps": "blkio.throttle.write_bps_device",
            "riops": "blkio.throttle.read_iops_device", "wiops": "blkio.throttle.write_iops_device"}


@dataclass(frozen=True)
class IoHierarchy:
    """Where block limits are written: `version` 2 (io.max) or 1 (blkio), rooted at `root`."""

    version: int
    root: Path

    def to_json(self) -> dict:
        return {"version": self.version, "root": str(self.root)}

    @classmethod
    def from_json(cls, d: dict) -> IoHierarchy:
        return cls(int(d["version"]), Path(d["root"]))

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

    # -- membership --------------------------------------------------------------------------------
    def cgroup_of(self, pid: int) -> Path:
        """The cgroup directory of `pid` in this hierarchy."""
        for line in _read(Path(f"/proc/{pid}/cgroup")).splitlines():
            hid, controllers, rel = line.split(":", 2)
            if (self.version == 2 and hid == "0") or (self.version == 1 and "blkio" in controllers.split(",")):
                return self.root / rel.lstrip("/")
        raise PreflightError(f"PID {pid}: not found in the {'v2' if self.version == 2 else 'blkio'} hierarchy")

    @staticmethod
    def move(pid: int, cgroup: Path) -> None:
        (cgroup / "cgroup.procs").write_text(f"{pid}\n")

    @staticmethod
    def procs(cgroup: Path) -> list[int]:
        return [int(x) for x in _read(cgroup / "cgroup.procs").split()]


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except FileNotFoundError:
        return ""


def find_io_hierarchy(mountinfo: Path = Path("/proc/self/mountinfo")) -> IoHierarchy:
    """Prefer cgroup v2 with the io controller; fall back to v1 blkio; PreflightError if neither."""
    all_mounts = mounts(mountinfo)
    for mp, fstype, _, _ in all_mounts:
        if fstype == "cgroup2" and "io" in _read(Path(mp) / "cgroup.controllers").split():
            return IoHierarchy(2, Path(mp))
    for mp, fstype, _, opts in all_mounts:
        if fstype == "cgroup" and "blkio" in opts:
            return IoHierarchy(1, Path(mp))
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
@dataclass(frozen=True)
class CpuHierarchy:
    """Where CPU bandwidth limits are written: `version` 2 (`cpu.max`) or 1 (`cpu.cfs_quota_us` and
    `cpu.cfs_period_us`), rooted at `root`. Quotas and periods are in microseconds; quota None = unlimited."""

    version: int
    root: Path

    def to_json(self) -> dict:
        return {"version": self.version, "root": str(self.root)}

    @classmethod
    def from_json(cls, d: dict) -> CpuHierarchy:
        return cls(int(d["version"]), Path(d["root"]))

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

    def cgroup_of(self, pid: int, tid: int | None = None) -> Path | None:
        """The cgroup of process `pid` (or of its thread `tid`) in this hierarchy; None if it is gone."""
        text = _read(Path(f"/proc/{pid}/task/{tid}/cgroup") if tid else Path(f"/proc/{pid}/cgroup"))
        if not text:
            return None
        for line in text.splitlines():
            hid, controllers, rel = line.split(":", 2)
            if (self.version == 2 and hid == "0") or (self.version == 1 and "cpu" in controllers.split(",")):
                return self.root / rel.lstrip("/")
        raise PreflightError(f"PID {pid}: not found in the {'v2' if self.version == 2 else 'cpu'} hierarchy")

    def tasks(self, cgroup: Path) -> list[int]:
        """Every thread (task id) in `cgroup`."""
        return [int(x) for x in _read(cgroup / ("cgroup.threads" if self.version == 2 else "tasks")).split()]

    def move_task(self, pid: int, tid: int, cgroup: Path) -> None:
        """Move one thread (v1 `tasks`); v2 domain cgroups hold whole processes, so there it moves `pid`."""
        if self.version == 2:
            IoHierarchy.move(pid, cgroup)
        else:
            (cgroup / "tasks").write_text(f"{tid}\n")


def find_cpu_hierarchy(mountinfo: Path = Path("/proc/self/mountinfo")) -> CpuHierarchy:
    """Prefer cgroup v2 with the cpu controller; fall back to a v1 hierarchy with cpu; PreflightError if neither."""
    all_mounts = mounts(mountinfo)
    for mp, fstype, _, _ in all_mounts:
        if fstype == "cgroup2" and "cpu" in _read(Path(mp) / "cgroup.controllers").split():
            return CpuHierarchy(2, Path(mp))
    for mp, fstype, _, opts in all_mounts:
        if fstype == "cgroup" and "cpu" in opts:
            return CpuHierarchy(1, Path(mp))
    raise PreflightError("CPU throttling needs the cgroup v2 cpu controller or a v1 cpu hierarchy; neither is "
                         "mounted here (/proc/self/mountinfo has no cgroup2 with cpu in cgroup.controllers and no "
                         "cgroup mount with the cpu option)")


# -- memory (process.memory_limit) --------------------------------------------------------------------
UNLIMITED_V1 = 1 << 62  # v1 reports "no limit" as PAGE_COUNTER_MAX pages (9223372036854771712 with 4 KiB pages)


@dataclass(frozen=True)
class MemHierarchy:
    """Where memory limits are written: `version` 2 (`memory.max`, `memory.current`, `memory.events`) or 1
    (`memory.limit_in_bytes`, `memory.usage_in_bytes`, `memory.failcnt`, `memory.oom_control`), rooted at
    `root`. Sizes are bytes; a limit of None = unlimited."""

    version: int
    root: Path

    def to_json(self) -> dict:
        return {"version": self.version, "root": str(self.root)}

    @classmethod
    def from_json(cls, d: dict) -> MemHierarchy:
        return cls(int(d["version"]), Path(d["root"]))

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
        so swap cannot absorb what the limit is meant to refuse; memory first: memsw may never be below it."""
        if self.version == 2:
            (cgroup / "memory.max").write_text(f"{nbytes}\n")
            swap = cgroup / "memory.swap.max"
            if swap.exists():
                swap.write_text("0\n")
            return
        (cgroup / "memory.limit_in_bytes").write_text(f"{nbytes}\n")
        memsw = cgroup / "memory.memsw.limit_in_bytes"
        if memsw.exists():
            memsw.write_text(f"{nbytes}\n")

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

    def cgroup_of(self, pid: int, tid: int | None = None) -> Path | None:
        """The cgroup of process `pid` (or of its thread `tid`) in this hierarchy; None if it is gone."""
        text = _read(Path(f"/proc/{pid}/task/{tid}/cgroup") if tid else Path(f"/proc/{pid}/cgroup"))
        if not text:
            return None
        for line in text.splitlines():
            hid, controllers, rel = line.split(":", 2)
            if (self.version == 2 and hid == "0") or (self.version == 1 and "memory" in controllers.split(",")):
                return self.root / rel.lstrip("/")
        raise PreflightError(f"PID {pid}: not found in the {'v2' if self.version == 2 else 'memory'} hierarchy")

    def tasks(self, cgroup: Path) -> list[int]:
        """Every thread (task id) in `cgroup`."""
        return [int(x) for x in _read(cgroup / ("cgroup.threads" if self.version == 2 else "tasks")).split()]

    def move_task(self, pid: int, tid: int, cgroup: Path) -> None:
        """Move one thread (v1 `tasks`); v2 domain cgroups hold whole processes, so there it moves `pid`."""
        if self.version == 2:
            IoHierarchy.move(pid, cgroup)
        else:
            (cgroup / "tasks").write_text(f"{tid}\n")


def find_mem_hierarchy(mountinfo: Path = Path("/proc/self/mountinfo")) -> MemHierarchy:
    """Prefer cgroup v2 with the memory controller; fall back to a v1 memory hierarchy; PreflightError if
    neither."""
    all_mounts = mounts(mountinfo)
    for mp, fstype, _, _ in all_mounts:
        if fstype == "cgroup2" and "memory" in _read(Path(mp) / "cgroup.controllers").split():
            return MemHierarchy(2, Path(mp))
    for mp, fstype, _, opts in all_mounts:
        if fstype == "cgroup" and "memory" in opts:
            return MemHierarchy(1, Path(mp))
    raise PreflightError("memory limits need the cgroup v2 memory controller or a v1 memory hierarchy; neither "
                         "is mounted here (/proc/self/mountinfo has no cgroup2 with memory in cgroup.controllers "
                         "and no cgroup mount with the memory option)")
