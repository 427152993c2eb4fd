"""Well-known locations: the state directory that holds ledgers (so `rollback --all` finds them), the library
bundled in the package (eBPF sources, probes, fault steps, experiments), the engines' cache."""

from __future__ import annotations

import importlib.resources
import os
from pathlib import Path

import chaoskit
from chaoskit.errors import ChaoskitError

LIBRARY_KINDS = ("bpf", "probes", "faults", "experiments", "matrices")


def state_dir() -> Path:
    """$CHAOSKIT_STATE_DIR, else /var/lib/chaoskit for root, else ~/.local/state/chaoskit."""
    env = os.environ.get("CHAOSKIT_STATE_DIR")
    if env:
        return Path(env)
    if os.geteuid() == 0:
        return Path("/var/lib/chaoskit")
    return Path(os.environ.get("XDG_STATE_HOME", Path.home() / ".local" / "state")) / "chaoskit"


def ledger_dir() -> Path:
    d = state_dir() / "ledgers"
    d.mkdir(parents=True, exist_ok=True)
    return d


def library(kind: str) -> Path:
    """A directory of the library bundled in the package (the package chaoskit.library.KIND, whose files are the
    folder KIND/ of the source tree): bpf, probes, faults, experiments or matrices. A directory on disk: bcc
    compiles the eBPF sources by path."""
    if kind not in LIBRARY_KINDS:
        raise ValueError(f"no library {kind!r} (one of {', '.join(LIBRARY_KINDS)})")
    try:
        found = importlib.resources.files(f"chaoskit.library.{kind}")
    except ModuleNotFoundError:
        found = None
    if not isinstance(found, Path) or not found.is_dir():
        raise ChaoskitError(f"chaoskit's bundled {kind}/ is missing ({found}): the package is incomplete or not "
                            "installed as files; reinstall it (pip install chaoskit)")
    return found


def package_parent() -> Path:
    """The directory the `chaoskit` package is imported from (site-packages of an installed wheel, the source tree
    of an editable install): what a child interpreter needs on PYTHONPATH to import this chaoskit."""
    return Path(chaoskit.__file__).resolve().parent.parent


def cache_dir() -> Path:
    """What chaoskit builds once and keeps (the native load sender): $CHAOSKIT_CACHE_DIR, else
    $XDG_CACHE_HOME/chaoskit (~/.cache/chaoskit)."""
    env = os.environ.get("CHAOSKIT_CACHE_DIR")
    return Path(env) if env else Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "chaoskit"


def engines_dir() -> Path:
    """Where the optional engines are installed (the vLLM venv and its model): for chaoskit run from a source
    tree, its .chaoskit/ (where `make vllm` installs); for an installed package, the cache directory."""
    parent = package_parent()
    if parent.name not in ("site-packages", "dist-packages"):
        return parent / ".chaoskit"
    return cache_dir()


def experiment_path(arg: Path) -> Path:
    """An experiment as named on the command line: an existing file or directory wins; else a bundled experiment
    by name (`sits2026/health-check-blindspot`, with or without .yaml) or a directory of them (`sits2026`);
    else `arg` as given (the caller says there is no such file)."""
    if arg.exists() or arg.is_absolute() or ".." in arg.parts:
        return arg
    root = library("experiments")
    for candidate in (root / arg, root / f"{arg}.yaml"):
        if candidate.exists():
            return candidate
    return arg

