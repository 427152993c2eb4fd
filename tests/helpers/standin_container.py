"""A container stand-in (no container runtime here): real processes in a real network namespace, inside a real
cgroup named the way containerd names a container's (`.../cri-containerd-<64 hex>.scope`), so the node side
of chaoskit finds them exactly as on a Kubernetes node."""

from __future__ import annotations

import os
import secrets
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

HIERARCHIES = (Path("/sys/fs/cgroup/pids"), Path("/sys/fs/cgroup/unified"), Path("/sys/fs/cgroup"))


def hierarchy() -> Path | None:
    """A writable cgroup hierarchy of this host (cgroup v1 pids, or the v2 one)."""
    for h in HIERARCHIES:
        if (h / "cgroup.procs").exists() and os.access(h, os.W_OK):
            return h
    return None


def hierarchy_or_skip() -> Path:
    """hierarchy(), or the test is skipped saying why."""
    import pytest

    root = hierarchy()
    if root is None:
        pytest.skip("no writable cgroup hierarchy (/sys/fs/cgroup/pids or the v2 one) for stand-in containers")
    return root


@dataclass
class StandIn:
    id: str  # the bare container ID (64 hex digits); the pod status says containerd://ID
    proc: subprocess.Popen
    cgroup: Path
    also: tuple[Path, ...] = ()  # the same cgroup in other hierarchies (v1 controllers) it was started in

    @property
    def container_id(self) -> str:
        return f"containerd://{self.id}"

    def pids(self) -> list[int]:
        return sorted(int(p) for p in (self.cgroup / "cgroup.procs").read_text().split())

    def stop(self) -> None:
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait(timeout=10)
        for path in (c for cg in (self.cgroup, *self.also) for c in (cg, cg.parent)):
            for _ in range(500):  # the group's last member leaves the cgroup a moment after it is reaped
                try:
                    path.rmdir()
                    break
                except OSError:
                    time.sleep(0.01)


def start(netns: str | None, root: Path, also: tuple[Path, ...] = (), env: dict[str, str] | None = None) -> StandIn:
    """`sh` (the container's init) and a `sleep` it forks, in network namespace `netns` (None: this host's), in a
    fresh cgroup (of hierarchy `root`, and of each other hierarchy root in `also`), with `env` added to the
    environment (what a container runtime sets, such as NVIDIA_VISIBLE_DEVICES)."""
    cid = secrets.token_hex(32)
    relative = Path(f"ckt-kubepods-{cid[:8]}") / f"cri-containerd-{cid}.scope"
    cgroups = [r / relative for r in (root, *(a for a in also if a != root))]
    for cg in cgroups:
        cg.mkdir(parents=True)

    def join() -> None:  # in the child, before exec: everything it forks is in the container's cgroups
        for cg in cgroups:
            (cg / "cgroup.procs").write_text(str(os.getpid()))

    inside = ["ip", "netns", "exec", netns] if netns else []
    proc = subprocess.Popen([*inside, "sh", "-c", "sleep 600 & wait"], preexec_fn=join, start_new_session=True,
                            env={**os.environ, **(env or {})})
    return StandIn(cid, proc, cgroups[0], tuple(cgroups[1:]))
