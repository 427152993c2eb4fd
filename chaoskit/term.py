"""The CLI's consoles and tables: a terminal's own width; piped to a file or a CI log, lines are never cut or
wrapped, and a table is as wide as its words need, not as its longest line."""

from __future__ import annotations

import dataclasses
import os
from copy import copy

from rich import table
from rich.console import Console, ConsoleOptions, RenderResult

PIPED_WIDTH = 1000  # wide enough that no line is cut; a table takes at most PIPED_TABLE_WIDTH of it
PIPED_TABLE_WIDTH = 160  # piped, a wider table wraps its cells at words to this width (wider only where a word needs)


def console(stderr: bool = False) -> Console:
    """A Console for stdout (or stderr): at a terminal as rich sizes it; otherwise (or with --plain/--ci output
    going to a pipe) PIPED_WIDTH columns, unless $COLUMNS says otherwise."""
    probe = Console(stderr=stderr)
    if probe.is_terminal or os.environ.get("COLUMNS"):
        return probe
    return Console(stderr=stderr, width=PIPED_WIDTH)


class Table(table.Table):
    """A rich Table that, printed anywhere but a terminal, is drawn in ASCII (a pipe's reader counts bytes, a log
    need not be read as UTF-8) and is at most PIPED_TABLE_WIDTH columns wide, wider only where its longest words
    need: each column is at least as wide as its longest word (nothing is cut), the rest of the width goes first to
    the columns that lack least to show their longest line whole; cells wrap at words."""

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        if console.is_terminal:
            yield from super().__rich_console__(console, options)
            return
        options = options.copy()
        options.encoding = "ascii"  # rich draws an ASCII box where the output is not UTF-8
        ranges = [self._measure_column(console, options, c) for c in self.columns]  # padding included
        space = min(options.max_width, PIPED_TABLE_WIDTH) - self._extra_width  # less the borders
        if sum(r.maximum for r in ranges) <= space or sum(r.minimum for r in ranges) > options.max_width - self._extra_width:
            yield from super().__rich_console__(console, options)
            return
        extra = _share(space - sum(r.minimum for r in ranges), [r.maximum - r.minimum for r in ranges])
        fitted = copy(self)
        fitted.columns = [dataclasses.replace(c, width=r.minimum + more - self._get_padding_width(c._index))
                          for c, r, more in zip(self.columns, ranges, extra, strict=True)]
        yield from table.Table.__rich_console__(fitted, console, options)


def _share(spare: int, lack: list[int]) -> list[int]:
    """`spare` columns shared out to columns that lack `lack` each: the smallest lacks met in full, what is left
    split evenly among the others."""
    extra = [0] * len(lack)
    for k, i in enumerate(sorted(range(len(lack)), key=lambda i: lack[i])):
        extra[i] = min(lack[i], max(0, spare) // (len(lack) - k))
        spare -= extra[i]
    return extra
