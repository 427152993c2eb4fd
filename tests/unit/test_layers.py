"""The layer contract in pyproject.toml ([tool.importlinter]) holds: no module imports a layer above its own,
no import cycle between sibling modules, and every top-level module of chaoskit sits in a layer."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

from tests.conftest import ROOT


def _lint_imports() -> str:
    found = Path(sys.executable).with_name("lint-imports")
    return str(found) if found.exists() else shutil.which("lint-imports") or "lint-imports"


def test_every_import_contract_is_kept():
    p = subprocess.run([_lint_imports(), "--no-cache"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "2 kept, 0 broken" in p.stdout, p.stdout


def test_a_layer_break_is_caught(tmp_path):
    """The contract can fail: a copy of the package where the model imports the engine is refused."""
    shutil.copytree(ROOT / "chaoskit", tmp_path / "chaoskit", ignore=shutil.ignore_patterns("__pycache__", "library"))
    shutil.copy2(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    with (tmp_path / "chaoskit" / "model" / "tolerance.py").open("a") as f:
        f.write("\nfrom chaoskit.engine import states  # noqa: E402,F401\n")
    p = subprocess.run([_lint_imports(), "--no-cache"], cwd=tmp_path, capture_output=True, text=True, timeout=120,
                       env={"PYTHONPATH": str(tmp_path), "PATH": "/usr/bin:/bin"})
    assert p.returncode == 1, p.stdout + p.stderr
    assert "chaoskit.model is not allowed to import chaoskit.engine" in p.stdout, p.stdout
