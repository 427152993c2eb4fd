"""What a fault holds on its host (kernel objects, files, helper processes), in words, from its ledger record
alone: the default of Injector.holds, for a family whose record's own fields say it."""

from __future__ import annotations

from typing import Any

from chaoskit.targets.process import ProcessRef, find_by_token

MAX_ITEMS = 8  # of a list: the rest counted
MAX_CHARS = 200  # of one value


def summary(record: Any) -> list[str]:
    """One line per field, `key: value`: a process (a record with a pid) as `PID n (comm)`, a list of them as
    their PIDs, a helper's `token` with the PIDs that carry it now, a nested record as `key.field: value`;
    empty fields left out."""
    if not isinstance(record, dict):
        return [_short(repr(record))] if record not in (None, {}, []) else []
    lines: list[str] = []
    for key, value in record.items():
        if key == "token" and isinstance(value, str):
            lines.append(f"helper {value}: {_pids(find_by_token(value)) or 'no process carries it now'}")
        elif _is_process(value):
            lines.append(f"{key}: {_process(value['pid'], value.get('comm'))}")
        elif isinstance(value, list) and value and all(_is_process(v) for v in value):
            lines.append(f"{key}: {_listed([_process(v['pid'], v.get('comm')) for v in value])}")
        elif isinstance(value, dict):
            lines += [f"{key}.{line}" for line in summary(value)]
        elif isinstance(value, list) and value:
            lines.append(f"{key}: {_listed([_short(str(v)) for v in value])}")
        elif value not in (None, "", [], {}):
            lines.append(f"{key}: {_short(str(value))}")
    return lines


def _is_process(value: Any) -> bool:
    return isinstance(value, dict) and isinstance(value.get("pid"), int)


def _process(pid: int, comm: str | None) -> str:
    return f"PID {pid}" + (f" ({comm})" if comm else "")


def _pids(refs: list[ProcessRef]) -> str:
    return _listed([_process(r.pid, r.comm) for r in refs])


def _listed(items: list[str]) -> str:
    more = len(items) - MAX_ITEMS
    return ", ".join(items[:MAX_ITEMS]) + (f" and {more} more" if more > 0 else "")


def _short(text: str) -> str:
    return text if len(text) <= MAX_CHARS else text[:MAX_CHARS - 1] + "…"
