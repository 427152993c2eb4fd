"""Find a container's processes on this node from its CRI container ID (through /proc/PID/cgroup).

Every container runtime Kubernetes uses (containerd, CRI-O, Docker) puts a container's processes in a cgroup
whose path holds the container ID (`.../cri-containerd-<id>.scope`, `.../crio-<id>.scope`, `.../<id>`), on
cgroup v1 and v2 alike, so a process in a helper pod with hostPID finds them without talking to the runtime.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import psutil

RUNTIME_PREFIXES = ("containerd://", "cri-o://", "docker://")
# the container's own cgroup directory is `<prefix><id>` or `<prefix><id>.scope`; CRI-O's monitor sits beside it
# as `crio-conmon-<id>.scope`, and systemd may leave `<id>.mount` units: neither is the container
DIR_PREFIXES = ("", "cri-containerd-", "crio-", "docker-", "libpod-")
_ID = re.compile(r"[0-9a-f]{12,64}")


class ContainerNotFound(LookupError):
    """No process of the container runs on this node (wrong node, exited, or no hostPID)."""


def bare_id(container_id: str) -> str:
    """The hex ID of `containerd://ID` (or cri-o://, docker://, or a bare ID); ValueError if it is not one."""
    cid = container_id
    for prefix in RUNTIME_PREFIXES:
        cid = cid.removeprefix(prefix)
    if not _ID.fullmatch(cid):
        raise ValueError(f"not a container ID: '{container_id}' (want [runtime://]12-64 hex digits)")
    return cid


def container_pids(container_id: str, proc: Path = Path("/proc")) -> list[int]:
    """PIDs of the container's processes, its init first (the one whose parent is outside the container), then by
    PID; ContainerNotFound if none."""
    cid = bare_id(container_id)
    pids = sorted(pid for pid in _pids(proc) if _in_container(_cgroups(proc / str(pid) / "cgroup"), cid))
    if not pids:
        raise ContainerNotFound(f"no process of container {cid[:12]} on this node (searched {proc}/*/cgroup; "
                                "is the pod on this node and the helper running with hostPID?)")
    inside = set(pids)
    return sorted(pids, key=lambda p: (_parent(p) in inside, p))


def container_cgroup(root: Path, container_id: str) -> Path:
    """The container's own cgroup in the hierarchy rooted at `root` (the node's whole tree: from a helper pod,
    the host's /sys/fs/cgroup mounted in), by its ID in the directory name; ContainerNotFound if none."""
    cid = bare_id(container_id)
    for top, dirs, _files in os.walk(root):
        for d in dirs:
            if is_container_dir(d, cid):
                return Path(top) / d
    raise ContainerNotFound(f"no cgroup of container {cid[:12]} under {root} (is the pod on this node, and the "
                            "host's /sys/fs/cgroup mounted in the helper?)")


def is_container_dir(name: str, cid: str) -> bool:
    """Whether a cgroup directory name is the container's own (not its runtime monitor's, nor a mount unit)."""
    return any(name.removesuffix(".scope") == prefix + cid for prefix in DIR_PREFIXES)


def _in_container(cgroup_lines: str, cid: str) -> bool:
    """Whether /proc/PID/cgroup text puts the process in the container's cgroup (or one below it)."""
    return any(is_container_dir(part, cid) for line in cgroup_lines.splitlines()
               for part in line.split(":", 2)[-1].split("/"))


def _pids(proc: Path) -> list[int]:
    return [int(p.name) for p in proc.iterdir() if p.name.isdigit()]


def _cgroups(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:  # exited meanwhile, or not ours to read
        return ""


def _parent(pid: int) -> int:
    try:
        return psutil.Process(pid).ppid()
    except psutil.Error:
        return 0
