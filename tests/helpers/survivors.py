"""What a test's reference deployment left running, read from the process list (not from the deployment's own
records, which `ref down` empties)."""

from __future__ import annotations

import os
from pathlib import Path

import psutil


def survivors(root: Path) -> list[str]:
    """'NAME PID' of each live process whose command line names a path starting with `root`, or whose working
    directory does (a deployment starts its processes in its directory, with their logs and configs there)."""
    mark, me, left = str(root), os.getpid(), []
    for p in psutil.process_iter(["pid", "name", "cmdline", "cwd", "status"]):
        info = p.info
        if info["pid"] == me or info["status"] == psutil.STATUS_ZOMBIE:
            continue
        if any(mark in a for a in info["cmdline"] or ()) or (info["cwd"] or "").startswith(mark):
            left.append(f"{info['name']} {info['pid']}")
    return left
