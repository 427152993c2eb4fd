"""Find a container's processes (and its cgroup, its GPUs) on this node from its CRI container ID (through
/proc/PID/cgroup).

Every container runtime Kubernetes uses (containerd, CRI-O, Docker) puts a container's processes in a cgroup
whose path holds the container ID (`.../cri-containerd-<id>.scope`, `.../crio-<id>.scope`, `.../<id>`), on
cgroup v1 and v2 alike, so a process in a helper pod with hostPID finds them without talking to the runtime.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

import psutil

RUNTIME_PREFIXES = ("containerd://", "cri-o://", "docker://")
# the container's own cgroup directory is `<prefix><id>` or `<prefix><id>.scope`; CRI-O's monitor sits beside it
# as `crio-conmon-<id>.scope`, and systemd may leave `<id>.mount` units: neither is the container
DIR_PREFIXES = ("", "cri-containerd-", "crio-", "docker-", "libpod-")
_ID = re.compile(r"[0-9a-f]{12,64}")
_NODE = re.compile(r"nvidia([0-9]+)")  # /dev/nvidia0 ... (not nvidiactl, nvidia-uvm, nvidia-caps)


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


@dataclass(frozen=True)
class ContainerGpus:
    """The GPUs a container was given, as this node names them: GPU-/MIG- UUIDs or nvidia-smi indices (from
    NVIDIA_VISIBLE_DEVICES in its init's environment, as the NVIDIA device plugin and container toolkit set it),
    `minor:N` (its /dev/nvidiaN device nodes, when that variable does not list them: CDI injection), or None
    for all of the node's GPUs (`all`)."""

    devices: tuple[str, ...] | None
    source: str

    def pick(self, device: int | str) -> str:
        """The node's name for the container's GPU `device`: its index among the container's GPUs (CUDA order
        inside it) or one of their UUIDs; LookupError if the container has no such GPU."""
        if isinstance(device, str):
            if self.devices is not None and device not in self.devices:
                raise LookupError(f"the container was not given GPU {device} (it has {', '.join(self.devices)}; "
                                  f"from {self.source})")
            return device
        if self.devices is None:
            return str(device)
        if device >= len(self.devices):
            raise LookupError(f"the container has {len(self.devices)} GPU(s) ({', '.join(self.devices)}; from "
                              f"{self.source}), no index {device}")
        return self.devices[device]


def container_gpus(container_id: str, proc: Path = Path("/proc")) -> ContainerGpus:
    """The GPUs of the container (through its init's /proc entry: a helper needs hostPID and SYS_PTRACE);
    ContainerNotFound if it runs no process here, LookupError if it was given no GPU."""
    init = container_pids(container_id, proc)[0]
    listed = _environ(proc / str(init) / "environ").get("NVIDIA_VISIBLE_DEVICES", "").strip()
    if listed == "all":
        return ContainerGpus(None, "NVIDIA_VISIBLE_DEVICES=all")
    if listed and listed not in ("none", "void"):
        return ContainerGpus(tuple(d.strip() for d in listed.split(",") if d.strip()), "NVIDIA_VISIBLE_DEVICES")
    dev = proc / str(init) / "root" / "dev"
    try:
        minors = sorted(int(m.group(1)) for e in os.listdir(dev) if (m := _NODE.fullmatch(e)))
    except OSError:
        minors = []
    if not minors:
        raise LookupError(f"container {bare_id(container_id)[:12]} was given no GPU (NVIDIA_VISIBLE_DEVICES is "
                          f"{listed or 'unset'} and it has no /dev/nvidiaN device)")
    return ContainerGpus(tuple(f"minor:{n}" for n in minors), "its /dev/nvidiaN devices")


def _environ(path: Path) -> dict[str, str]:
    try:
        raw = path.read_bytes()
    except OSError:
        return {}
    return dict(kv.split("=", 1) for kv in raw.decode(errors="replace").split("\0") if "=" in kv)


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
