"""Where iproute2 keeps netem's delay-distribution tables (no pyroute2 here: a run's preflight reads it)."""

from __future__ import annotations

from pathlib import Path

from chaoskit.errors import PreflightError

DIST_DIRS = ("/usr/lib/x86_64-linux-gnu/tc", "/usr/lib/aarch64-linux-gnu/tc", "/usr/lib64/tc", "/usr/lib/tc",
             "/usr/share/tc")


def dist_file(name: str) -> Path:
    """Where iproute2 keeps the distribution table `name`."""
    for d in DIST_DIRS:
        f = Path(d) / f"{name}.dist"
        if f.exists():
            return f
    raise PreflightError(f"network.netem: distribution table {name}.dist not found in {', '.join(DIST_DIRS)} "
                         "(install iproute2)")
