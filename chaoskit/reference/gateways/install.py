"""Install a gateway by package name into chaoskit's directory: a pinned PyPI package into a venv of its own,
or a Debian package with apt (as root); idempotent, with progress."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from chaoskit import paths
from chaoskit.errors import PreflightError
from chaoskit.reference.pipinstall import run_pip


def home(name: str) -> Path:
    """Where a PyPI gateway's venv lives: $CHAOSKIT_GATEWAYS_HOME/NAME, else the engines' directory/gateways/NAME."""
    env = os.environ.get("CHAOSKIT_GATEWAYS_HOME")
    return (Path(env) if env else paths.engines_dir() / "gateways") / name


def venv_bin(name: str, program: str) -> Path:
    return home(name) / "venv" / "bin" / program


def pip_installed(name: str, pin: str) -> bool:
    stamp = home(name) / "venv" / ".chaoskit-installed"
    return stamp.exists() and stamp.read_text().strip() == pin


def pip_install(name: str, pin: str, say: Callable[[str], None], force: bool = False) -> tuple[str, bool]:
    """`pin` (e.g. vllm-router==0.1.17) into home(name)/venv, once."""
    venv = home(name) / "venv"
    if pip_installed(name, pin) and not force:
        return f"{pin} in {venv}", False
    say(f"installing {pin} into {venv}")
    venv.parent.mkdir(parents=True, exist_ok=True)
    made = subprocess.run([sys.executable, "-m", "venv", "--clear", str(venv)], capture_output=True, text=True)
    if made.returncode != 0:
        raise PreflightError(f"creating the venv {venv} failed: {made.stderr.strip()[-400:]}")
    run_pip([str(venv / "bin" / "pip"), "install", "--disable-pip-version-check", pin], f"installing {pin}", say,
            log=venv.parent / "install.log")
    (venv / ".chaoskit-installed").write_text(pin + "\n")
    return f"{pin} in {venv}", True


def apt_install(package: str, binary: str, say: Callable[[str], None], force: bool = False) -> tuple[str, bool]:
    """The Debian package that provides `binary`, once (apt-get as root). Its own service is not used: chaoskit
    starts the binary with its own configuration."""
    found = shutil.which(binary) or (f"/usr/sbin/{binary}" if Path(f"/usr/sbin/{binary}").exists() else None)
    if found and not force:
        return found, False
    if os.geteuid() != 0 or not shutil.which("apt-get"):
        raise PreflightError(f"{binary} is not installed: install the package {package} (Debian/Ubuntu: "
                             f"`apt-get install {package}`, as root)")
    say(f"installing the Debian package {package} (apt-get)")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    r = subprocess.run(["apt-get", "install", "-y", "-q", "--no-install-recommends", package], capture_output=True,
                       text=True, env=env, stdin=subprocess.DEVNULL)
    if r.returncode != 0:
        raise PreflightError(f"apt-get install {package} failed ({r.returncode}): {r.stderr.strip()[-400:]}")
    return shutil.which(binary) or f"/usr/sbin/{binary}", True


def version_of(argv: list[str], pick: Callable[[str], str]) -> str:
    """`pick` applied to what `argv` (a --version call) printed; 'unknown' when it cannot run."""
    try:
        r = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    return pick(r.stdout + r.stderr) or "unknown"
