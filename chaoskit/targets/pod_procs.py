"""A Kubernetes pod's processes on this node, found by the pod UID the kubelet puts in their cgroup paths.

The kubelet names each pod's cgroup after its UID (`kubepods-burstable-pod<uid with _>.slice` with the systemd
driver, `kubepods/burstable/pod<uid>` with cgroupfs): every container of the pod, restarted ones included, sits
below it. A container restart gives new container IDs and PIDs but keeps the pod UID and the pod's volumes.
"""

from __future__ import annotations

import re
from pathlib import Path

_POD = re.compile(r"pod([0-9a-f]{8}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{12})(?:\.slice)?$")


def pod_uid_of(pid: int, proc: Path = Path("/proc")) -> str | None:
    """The UID (with dashes) of the pod whose cgroup holds the process; None outside a pod or if unreadable."""
    for part in _parts(proc / str(pid) / "cgroup"):
        m = _POD.search(part)
        if m:
            return m.group(1).replace("_", "-")
    return None


def pod_pids(uid: str, proc: Path = Path("/proc")) -> list[int]:
    """PIDs of every process in the pod's cgroup (any of its containers), by PID."""
    want = uid.replace("_", "-")
    out = []
    for entry in proc.iterdir():
        if entry.name.isdigit() and any((m := _POD.search(p)) and m.group(1).replace("_", "-") == want
                                        for p in _parts(entry / "cgroup")):
            out.append(int(entry.name))
    return sorted(out)


def _parts(path: Path) -> list[str]:
    try:
        text = path.read_text()
    except OSError:  # exited meanwhile, or not ours to read
        return []
    return [part for line in text.splitlines() for part in line.split(":", 2)[-1].split("/") if part]
