"""chaoskit as a user installs it: the wheel built from this working tree, installed alone into a fresh venv
outside the checkout; its dependencies come from the project's .venv through a plain path entry in a .pth file
(a plain entry does not run .venv's own .pth files, so the editable chaoskit installed there stays invisible)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
from dataclasses import dataclass
from pathlib import Path

from tests.conftest import ROOT

# the bundled library: folders beside chaoskit/ in this tree, chaoskit/library/KIND in the wheel (setup.py)
LIBRARY = ("bpf", "experiments", "faults", "matrices", "probes")


@dataclass
class User:
    """The installed CLI, run as a user would: from `home` (outside the checkout), without CHAOSKIT_* variables."""

    venv: Path
    wheel: Path
    home: Path
    env: dict[str, str]

    def run(self, *args: str, cwd: Path | None = None, timeout: float = 60) -> subprocess.CompletedProcess:
        return subprocess.run([str(self.venv / "bin" / "chaoskit"), *args], cwd=cwd or self.home, env=self.env,
                              capture_output=True, text=True, timeout=timeout)

    def python(self, code: str) -> str:
        p = subprocess.run([str(self.venv / "bin" / "python"), "-c", code], cwd=self.home, env=self.env,
                           capture_output=True, text=True, timeout=60)
        assert p.returncode == 0, p.stdout + p.stderr
        return p.stdout.strip()


def user_env() -> dict[str, str]:
    """This process's environment less what would point a command at the checkout or its settings."""
    return {k: v for k, v in os.environ.items()
            if not k.startswith("CHAOSKIT_") and k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "COLUMNS")}


def install(top: Path) -> User:
    """Build the wheel into TOP/dist and install it into TOP/venv; TOP/home is an empty directory to run from."""
    # the wheel of this working tree (built from a copy: no build/ or egg-info in the checkout)
    src = top / "src"
    src.mkdir()
    for name in ("pyproject.toml", "setup.py", "README.md"):
        shutil.copy2(ROOT / name, src / name)
    for folder in ("chaoskit", *LIBRARY):  # the bundled library's folders beside chaoskit/ (setup.py maps them)
        shutil.copytree(ROOT / folder, src / folder, ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "*.so"))
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w",
                    str(top / "dist"), str(src)], check=True, capture_output=True, timeout=120)
    (wheel,) = (top / "dist").glob("chaoskit-*.whl")
    # a fresh venv with that wheel alone; the dependencies through a path entry to .venv's site-packages
    venv = top / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=60)
    subprocess.run([sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"), "install", "-q",
                    "--no-deps", "--no-index", str(wheel)], check=True, capture_output=True, timeout=120)
    site = Path(subprocess.run([str(venv / "bin" / "python"), "-c", "import sysconfig; print(sysconfig.get_paths()"
                                "['purelib'])"], check=True, capture_output=True, text=True).stdout.strip())
    (site / "_test_dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    home = top / "home"
    home.mkdir()
    assert not home.resolve().is_relative_to(ROOT.resolve())
    return User(venv, wheel, home, user_env())
