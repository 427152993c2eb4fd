"""The CLI's consoles: a terminal's own width; piped to a file or a CI log, lines are never cut or wrapped."""

from __future__ import annotations

import os

from rich.console import Console

PIPED_WIDTH = 1000  # wide enough that no table or line is cut; tables still take only the width they need


def console(stderr: bool = False) -> Console:
    """A Console for stdout (or stderr): at a terminal as rich sizes it; otherwise (or with --plain/--ci output
    going to a pipe) PIPED_WIDTH columns, unless $COLUMNS says otherwise."""
    probe = Console(stderr=stderr)
    if probe.is_terminal or os.environ.get("COLUMNS"):
        return probe
    return Console(stderr=stderr, width=PIPED_WIDTH)
