"""The CLI's own text read through a pipe, as a user pipes it to less or a CI log keeps it: help summaries wrap
where the screen ends, not where a docstring's source line did; a piped table is as wide as its words need."""

from __future__ import annotations

import pytest

from tests.conftest import chaoskit


def commands_panel(text: str) -> list[tuple[str, str]]:
    """The rows of typer's Commands panel: (the command's name, or "" on a continuation line; the text between
    the panel's borders)."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("╭─ Commands"))
    end = next(i for i, line in enumerate(lines) if i > start and line.startswith("╰"))
    return [(line[2:].split(" ", 1)[0], line[1:-1]) for line in lines[start + 1:end]]


@pytest.mark.parametrize("group", [[], ["ref"]], ids=["chaoskit", "chaoskit-ref"])
def test_help_breaks_a_summary_only_where_the_next_word_does_not_fit(state_dir, group):
    p = chaoskit(*group, "--help", state=state_dir)
    out, err = p.communicate(timeout=60)
    assert p.returncode == 0, err
    rows = commands_panel(out)
    assert len(rows) >= (20 if not group else 6), out  # 16 commands, some on two lines or more
    col = min(len(body) - len(body.lstrip()) for name, body in rows if not name)  # where descriptions start
    widest = max(len(body[col:].rstrip()) for _, body in rows)  # the description column is at least this wide
    pairs = zip(rows, rows[1:], strict=False)
    early = [f"{body.strip()!r} + {nxt[col:].split()[0]!r}" for (_, body), (name, nxt) in pairs if not name and len(body[col:].rstrip()) + 1 + len(nxt[col:].split()[0]) <= widest]
    assert early == [], "a line ends before the next word, which fits on it:\n" + "\n".join(early) + "\n" + out


def test_piped_list_keeps_each_summary_whole_in_a_table_under_200_columns(state_dir):
    """`chaoskit list | awk '{ print length }' | sort -n | tail -1` is under 200 for the injectors table (awk
    counts bytes here: the table is ASCII), and each injector's summary is there whole, wrapped at words."""
    from chaoskit.injectors import INJECTORS

    p = chaoskit("list", state=state_dir)  # stdout: a pipe
    out, err = p.communicate(timeout=60)
    assert p.returncode == 0, err
    lines = out.splitlines()
    titles = [line.rstrip() for line in lines]  # a title is padded to its table's width
    start, end = titles.index("injectors"), titles.index("probes")
    table = lines[start:end]
    widest = max(len(line.encode()) for line in table)
    assert widest < 200, "\n".join(table)
    summaries: dict[str, list[str]] = {}
    for line in table[4:-1]:  # title, top border, header, separator ... bottom border
        _, name, words, _ = line.split("|")
        if name.strip():
            summaries[name.strip()] = []
        summaries[list(summaries)[-1]].append(words.strip())
    assert {name: " ".join(parts) for name, parts in summaries.items()} == {c.type: c.summary for c in INJECTORS}
    print(f"injectors table: {len(table)} lines, widest {widest} bytes")
