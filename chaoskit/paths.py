"""Well-known locations: the state directory that holds ledgers (so `rollback --all` finds them)."""

from __future__ import annotations

import os
from pathlib import Path


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
