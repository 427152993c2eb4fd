"""Piped to a file or a CI log, the CLI's lines are not cut or wrapped at 80 columns."""

from __future__ import annotations

from rich.table import Table

from chaoskit.term import PIPED_WIDTH, console


def test_piped_output_keeps_whole_lines_and_table_cells(monkeypatch):
    monkeypatch.delenv("COLUMNS", raising=False)
    c = console()  # pytest captures stdout: not a terminal
    assert c.width == PIPED_WIDTH
    table = Table("name", "url", "log")
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
