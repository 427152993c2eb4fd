"""Piped to a file or a CI log, the CLI's lines are not cut or wrapped at 80 columns."""

from __future__ import annotations

import io

from rich.console import Console
from rich.table import Table as RichTable

from chaoskit.term import PIPED_TABLE_WIDTH, PIPED_WIDTH, Table, console


def test_piped_output_keeps_whole_lines_and_table_cells(monkeypatch):
    monkeypatch.delenv("COLUMNS", raising=False)
    c = console()  # pytest captures stdout: not a terminal
    assert c.width == PIPED_WIDTH
    table = RichTable("name", "url", "log")
    url, log = "http://127.0.0.1:18000/v2/models/tiny_lm/generate", "/var/lib/chaoskit/ref/logs/" + "x" * 120 + ".log"
    table.add_row("triton-0", url, log)
    with c.capture() as cap:
        c.print("y" * 300, highlight=False)
        c.print(table)
    text = cap.get()
    assert "y" * 300 in text.splitlines() and url in text and log in text


def test_columns_still_wins(monkeypatch):
    monkeypatch.setenv("COLUMNS", "100")
    assert console().width == 100


def piped(table: Table) -> list[str]:
    out = Console(file=io.StringIO(), width=PIPED_WIDTH)  # not a terminal
    out.print(table)
    return out.file.getvalue().splitlines()


def test_a_piped_table_wraps_its_long_cells_at_words_to_the_width_cap():
    table = Table("type", "what it does")
    summary = " ".join(f"word{i}" for i in range(60))  # 409 columns on one line
    table.add_row("network.netem", summary)
    table.add_row("gpu.xid", "short")
    lines = piped(table)
    assert max(len(line.encode()) for line in lines) == PIPED_TABLE_WIDTH  # ASCII: awk's bytes are columns
    assert lines[0].startswith("+---") and lines[2].startswith("|---")
    cells = [line.split("|")[1:3] for line in lines if line.startswith("| ")]
    assert [c[0].strip() for c in cells if c[0].strip()] == ["type", "network.netem", "gpu.xid"]
    assert " ".join(c[1].strip() for c in cells[1:-1]) == summary  # every word, in order, none cut
    assert len(cells) == 1 + 3 + 1  # header, the summary on 3 lines, the short row


def test_a_piped_table_is_wider_than_the_cap_only_for_a_word_that_needs_it():
    table = Table("name", "url", "log")
    url, log = "http://127.0.0.1:18000/v2/models/tiny_lm/generate", "/var/lib/chaoskit/ref/logs/" + "x" * 120 + ".log"
    table.add_row("triton-0 " * 20, url + " and some words" * 10, log)
    lines = piped(table)
    assert max(map(len, lines)) == 8 + len(url) + len(log) + 3 * 3 + 1  # each column its longest word, + borders
    text = "\n".join(lines)
    assert url in text and log in text and "…" not in text


def test_a_narrow_piped_table_and_a_terminal_table_are_left_as_rich_draws_them():
    table = Table("a", "b")
    table.add_row("x", "y")
    assert piped(table) == ["+-------+", "| a | b |", "|---+---|", "| x | y |", "+-------+"]
    term = Console(file=io.StringIO(), width=PIPED_WIDTH, force_terminal=True, color_system=None)
    term.print(table)
    assert "┃ a ┃ b ┃" in term.file.getvalue()
