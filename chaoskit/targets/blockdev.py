"""Resolve a path to its mount, its block device and the whole-disk major:minor that cgroup throttling needs."""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass, field
from pathlib import Path

from chaoskit.errors import PreflightError


@dataclass(frozen=True)
class BlockTarget:
    path: str
    mount_point: str
    fs_type: str
    source: str
    device: str  # major:minor holding the filesystem (may be a partition)
    disk: str  # major:minor of the whole disk that io.max / blkio.throttle accept
    disk_name: str
    notes: list[str] = field(default_factory=list)

    def describe(self) -> str:
        part = "" if self.device == self.disk else f" (partition {self.device} of it)"
        return f"{self.path} is on {self.source} ({self.fs_type} at {self.mount_point}); " \
               f"throttling disk {self.disk_name} [{self.disk}]{part}" + \
               ("; " + "; ".join(self.notes) if self.notes else "")


def mounts(mountinfo: Path = Path("/proc/self/mountinfo")) -> list[tuple[str, str, str, list[str]]]:
    """(mount point, fs type, source, super options) of every mount, in mountinfo order."""
    out = []
    for line in mountinfo.read_text().splitlines():
        left, _, right = line.partition(" - ")
        parts, rparts = left.split(), right.split()
        if len(parts) >= 5 and len(rparts) >= 3:
            out.append((parts[4].replace("\\040", " "), rparts[0], rparts[1], rparts[2].split(",")))
    return out


def _mount_of(path: Path, mountinfo: Path) -> tuple[str, str, str]:
    """(mount point, fs type, source) of the longest mount point containing `path`."""
    best = ("", "", "")
    for mp, fstype, source, _ in mounts(mountinfo):
        inside = str(path) == mp or str(path).startswith(mp.rstrip("/") + "/")
        if inside and len(mp) >= len(best[0]):
            best = (mp, fstype, source)
    return best


def whole_disk(dev: str, sysfs: Path = Path("/sys")) -> tuple[str, str, list[str]]:
    """(major:minor of the whole disk, its name, notes) for a block device major:minor."""
    link = sysfs / "dev" / "block" / dev
    if not link.exists():
        raise PreflightError(f"block device {dev} not found under {link.parent}")
    node = link.resolve()
    notes: list[str] = []
    if (node / "partition").exists():
        parent = node.parent
        notes.append(f"{node.name} is a partition; block throttling applies to the whole disk {parent.name}")
        node = parent
    name = node.name
    if name.startswith("dm-"):
        slaves = sorted(p.name for p in (node / "slaves").iterdir()) if (node / "slaves").is_dir() else []
        dm_name = (node / "dm" / "name").read_text().strip() if (node / "dm" / "name").exists() else name
        notes.append(f"device-mapper {dm_name} ({name}) over {', '.join(slaves) or 'no visible devices'}; "
                     "throttling the dm device itself (bio-based, so limits hold above the underlying disks)")
    if name.startswith("loop") and (node / "loop" / "backing_file").exists():
        notes.append(f"loop device backed by {(node / 'loop' / 'backing_file').read_text().strip()}")
    return (node / "dev").read_text().strip(), name, notes


def resolve_path(path: str | Path, sysfs: Path = Path("/sys"),
                 mountinfo: Path = Path("/proc/self/mountinfo")) -> BlockTarget:
    p = Path(path)
    try:
        st = os.stat(p)
    except OSError as e:
        raise PreflightError(f"{p}: {e.strerror}") from None
    real = p.resolve()
    mp, fstype, source = _mount_of(real, mountinfo)
    if stat.S_ISBLK(st.st_mode):
        dev = f"{os.major(st.st_rdev)}:{os.minor(st.st_rdev)}"
        mp, fstype, source = "-", "raw block device", str(p)
    else:
        dev = f"{os.major(st.st_dev)}:{os.minor(st.st_dev)}"
        if os.major(st.st_dev) == 0:
            raise PreflightError(f"{p} is on {fstype or 'a virtual filesystem'} ({source} at {mp}), which has no "
                                 "block device to throttle")
    disk, name, notes = whole_disk(dev, sysfs)
    return BlockTarget(str(p), mp, fstype, source, dev, disk, name, notes)


def root_disk(sysfs: Path = Path("/sys"), root: str = "/") -> str | None:
    """The whole disk holding `/` (or `root`: /proc/1/root is the node's from a helper pod with hostPID), or None
    if it has no block device."""
    try:
        return resolve_path(root, sysfs).disk
    except PreflightError:
        return None
