"""Whether this host has a cgroup hierarchy with a controller, decided without chaoskit: /proc/mounts read here
(chaoskit's finders read /proc/self/mountinfo with their own parser). A test skips only when this says there is
none; where there is one, chaoskit's finder must find it (its PreflightError fails the test)."""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

H = TypeVar("H")


def _unescape(field: str) -> str:
    """/proc/mounts writes a space, tab, newline and backslash in a path as octal escapes (\\040)."""
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)


def hierarchies_with(controller: str, v1_option: str, mounts: Path = Path("/proc/mounts")) -> list[Path]:
    """Every mount point of a hierarchy with the controller: cgroup2 mounts whose cgroup.controllers lists
    `controller`, cgroup (v1) mounts with the `v1_option` mount option."""
    found = []
    for line in mounts.read_text().splitlines():
        fields = line.split()
        if len(fields) < 4:
            continue
        mp, fstype, opts = Path(_unescape(fields[1])), fields[2], fields[3].split(",")
        if fstype == "cgroup" and v1_option in opts:
            found.append(mp)
        elif fstype == "cgroup2":
            try:
                if controller in (mp / "cgroup.controllers").read_text().split():
                    found.append(mp)
            except OSError:
                pass
    return found


def hierarchy_or_skip(find: Callable[[], H], controller: str, v1_option: str) -> H:
    """find() (chaoskit's finder) where root and a hierarchy with the controller exist; the test skips where
    not. Its result's root must be one of the mounts found here."""
    import pytest

    if os.geteuid() != 0:
        pytest.skip("needs root to create cgroups and move processes")
    mounted = hierarchies_with(controller, v1_option)
    if not mounted:
        pytest.skip(f"no cgroup hierarchy with the {controller} controller is mounted (/proc/mounts: no cgroup2 "
                    f"listing it in cgroup.controllers, no cgroup mount with the {v1_option} option)")
    hier = find()  # the host has one: a finder that does not find it fails the test
    assert hier.root in mounted, f"chaoskit found {hier.root}, /proc/mounts has the {controller} controller at {mounted}"
    return hier
