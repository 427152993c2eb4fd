"""`chaoskit doctor --fix`: the package commands that provide what doctor found missing, run on apt hosts as root."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Callable
from dataclasses import dataclass, field

from chaoskit.doctor import KERNEL, REQUIREMENTS, Check, Requirement
from chaoskit.errors import PreflightError

FAMILIES = {"debian": "Debian/Ubuntu", "rhel": "RHEL-family"}


@dataclass
class FixPlan:
    """What --fix runs (commands) and what no command here provides (manual, one line each)."""

    family: str  # "debian" (apt-get) or "rhel" (dnf: printed, never run)
    packages: list[str] = field(default_factory=list)
    extra: list[list[str]] = field(default_factory=list)  # after the packages: modprobe, mount
    manual: list[str] = field(default_factory=list)

    def commands(self) -> list[list[str]]:
        if not self.packages:
            return list(self.extra)
        if self.family == "debian":
            install = [["apt-get", "update"], ["apt-get", "install", "-y", "--no-install-recommends", *self.packages]]
        else:
            install = [["dnf", "install", "-y", *self.packages]]
        return install + self.extra


def host_family() -> str:
    """debian where apt-get is, else rhel (whose commands --fix prints and does not run)."""
    return "debian" if shutil.which("apt-get") and shutil.which("dpkg-query") else "rhel"


def package_installed(family: str, name: str) -> bool:
    argv = ["dpkg-query", "-W", "-f=${Status}", name] if family == "debian" else ["rpm", "-q", name]
    try:
        r = subprocess.run(argv, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return r.returncode == 0 and (family != "debian" or "install ok installed" in r.stdout)


def kernel_packaged(family: str) -> bool:
    """Whether the running kernel came from a package (so packages built for it can exist)."""
    argv = ["dpkg-query", "-S", f"/lib/modules/{KERNEL}"] if family == "debian" else ["rpm", "-qf",
                                                                                     f"/lib/modules/{KERNEL}"]
    try:
        return subprocess.run(argv, capture_output=True, timeout=30).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def plan(checks: list[Check], family: str | None = None) -> FixPlan:
    """The packages and commands that provide each failing check's missing requirements, once each."""
    fp = FixPlan(family or host_family())
    seen: set[str] = set()
    for c in checks:
        for rid in c.missing:
            if rid not in seen and not c.ok:
                seen.add(rid)
                _add(fp, REQUIREMENTS[rid], c)
    return fp


def _add(fp: FixPlan, req: Requirement, check: Check) -> None:
    family = fp.family
    if not req.installable:
        fp.manual.append(f"{req.what} ({check.area}): {req.remedy()}")
        return
    if req.kernel_specific(family) and not kernel_packaged(family):
        fp.manual.append(f"{req.what} ({check.area}): no {FAMILIES[family]} package provides it for kernel "
                         f"{KERNEL}, which was not installed from one; boot a distribution kernel, or build this "
                         f"one with {req.kernel_option or 'it'}")
        return
    wanted = req.packages(family)
    todo = [p for p in wanted if not package_installed(family, p)]
    if wanted and not todo:
        fp.manual.append(f"{req.what} ({check.area}): {' '.join(wanted)} installed, yet: {check.detail}")
        return
    fp.packages += [p for p in todo if p not in fp.packages]
    fp.extra += [list(c) for c in req.commands if list(c) not in fp.extra]


def run(fp: FixPlan, say: Callable[[str], None]) -> None:
    """Run the plan's commands (root, apt host), each shown first; PreflightError when one fails."""
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for argv in fp.commands():
        say(f"$ {' '.join(argv)}")
        try:
            rc = subprocess.run(argv, env=env, stdin=subprocess.DEVNULL).returncode
        except OSError as e:
            raise PreflightError(f"doctor --fix: {argv[0]}: {e}") from None
        if rc != 0:
            raise PreflightError(f"doctor --fix: `{' '.join(argv)}` failed (exit {rc}); nothing after it was run")
