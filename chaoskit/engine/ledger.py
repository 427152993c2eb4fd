"""The ledger: one append-only, fsync'd JSON-lines file per run listing every fault and its revert record.

Lines: open (run identity), watchdog, watching (its handshake), intent (written before apply, with the time
the fault expires, the executor that applies it and its placement; a line without executor means local),
applied, reverted, revert_failed, closed. A ledger without `closed` has faults that may still be in effect.
"""

from __future__ import annotations

import fcntl
import json
import os
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from chaoskit.paths import ledger_dir
from chaoskit.targets.process import ProcessRef, is_alive, proc_ref

LOCK_TIMEOUT_S = 60.0


class LedgerLockTimeout(RuntimeError):
    pass


@dataclass
class Entry:
    id: int
    type: str
    record: dict[str, Any]
    plan: list[str] = field(default_factory=list)
    applied: bool = False
    reverted: bool = False
    failures: list[str] = field(default_factory=list)
    expires_at: float | None = None  # the watchdog reverts it after this even while the run lives (a hung run)
    executor: str = "local"  # what applied it, so rollback and the watchdog revert it the same way
    placement: dict[str, Any] | None = None  # where it runs (plain JSON from the target layer)
    group: str | None = None  # the `parallel` block it was applied in (its reverts may run at once)


@dataclass
class LedgerState:
    run_id: str = ""
    experiment: str = ""
    owner: ProcessRef | None = None
    watchdog: ProcessRef | None = None
    watching: dict[str, Any] | None = None  # the current watchdog's handshake: pid, cgroups it escaped to
    entries: dict[int, Entry] = field(default_factory=dict)
    closed: bool = False

    def pending(self) -> list[Entry]:
        """Entries that may be in effect (applied or only intended), newest first."""
        return [e for e in sorted(self.entries.values(), key=lambda e: e.id, reverse=True) if not e.reverted]

    def owner_alive(self) -> bool:
        return self.owner is not None and is_alive(self.owner)

    def watchdog_alive(self) -> bool:
        return self.watchdog is not None and is_alive(self.watchdog)


class Ledger:
    def __init__(self, path: Path):
        self.path = Path(path)
        self._last_id: int | None = None  # only the run writes intents: read the file once, then count
        self._ids = threading.Lock()  # the faults of a parallel step write their intents from threads

    @classmethod
    def create(cls, run_id: str, experiment: str, directory: Path | None = None) -> Ledger:
        d = directory or ledger_dir()
        d.mkdir(parents=True, exist_ok=True)
        ledger = cls(d / f"{run_id}.jsonl")
        me = proc_ref(os.getpid())
        ledger._append({"op": "open", "run_id": run_id, "experiment": experiment,
                        "owner": me.to_json() if me else None})
        _fsync_dir(d)
        return ledger

    def _append(self, *objs: dict[str, Any]) -> None:
        """Append lines in one write and one fsync (a torn last line after a crash is ignored by `read`). Safe
        from several threads: an O_APPEND write to a regular file is never interleaved with another."""
        now = time.time()
        lines = "".join(json.dumps({**obj, "t": now}, separators=(",", ":")) + "\n" for obj in objs)
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            data = memoryview(lines.encode())
            while data:  # a short write must not leave a torn line for the next append to run into
                data = data[os.write(fd, data):]
            os.fsync(fd)
        finally:
            os.close(fd)

    def set_watchdog(self, ref: ProcessRef) -> None:
        self._append({"op": "watchdog", "proc": ref.to_json()})

    def watching(self, info: dict[str, Any]) -> None:
        """The watchdog's handshake: it is out of the job's cgroups (where it could be) and watching."""
        self._append({"op": "watching", **info})

    def intent(self, type_name: str, record: dict[str, Any], plan: list[str], expires_at: float | None = None,
               executor: str = "local", placement: dict[str, Any] | None = None, group: str | None = None) -> int:
        with self._ids:
            if self._last_id is None:
                self._last_id = max(self.read().entries, default=0)
            self._last_id += 1
            new_id = self._last_id
        line = {"op": "intent", "id": new_id, "type": type_name, "record": record, "plan": plan,
                "expires_at": expires_at, "executor": executor}
        if placement is not None:
            line["placement"] = placement
        if group is not None:
            line["group"] = group
        self._append(line)
        return new_id

    def applied(self, entry_id: int, record: dict[str, Any], expires_at: float | None = None) -> None:
        self._append({"op": "applied", "id": entry_id, "record": record, "expires_at": expires_at})

    def reverted(self, entry_id: int) -> None:
        self._append({"op": "reverted", "id": entry_id})

    def reverted_many(self, entry_ids: list[int]) -> None:
        """The `reverted` marks of a batch whose faults are all reverted, in one fsync."""
        if entry_ids:
            self._append(*({"op": "reverted", "id": i} for i in entry_ids))

    def revert_failed(self, entry_id: int, error: str) -> None:
        self._append({"op": "revert_failed", "id": entry_id, "error": error})

    def close(self) -> None:
        self._append({"op": "closed"})

    def is_ledger(self) -> bool:
        """Does the file start with a ledger's `open` line? (`rollback --ledger` must never write to another file.)"""
        try:
            with open(self.path, encoding="utf-8") as f:
                return json.loads(f.readline()).get("op") == "open"
        except (OSError, ValueError, AttributeError, UnicodeDecodeError):
            return False

    def read(self) -> LedgerState:
        st = LedgerState()
        try:
            lines = self.path.read_text().splitlines()
        except FileNotFoundError:
            st.closed = True  # a discarded ledger has nothing pending
            return st
        for line in lines:
            try:
                obj = json.loads(line)
            except ValueError:
                continue  # a torn last line after a crash: everything before it is intact
            op = obj.get("op")
            if op == "open":
                st.run_id, st.experiment = obj.get("run_id", ""), obj.get("experiment", "")
                st.owner = ProcessRef.from_json(obj["owner"]) if obj.get("owner") else None
            elif op == "watchdog":
                st.watchdog, st.watching = ProcessRef.from_json(obj["proc"]), None
            elif op == "watching" and st.watchdog is not None and obj.get("pid") == st.watchdog.pid:
                st.watching = obj
            elif op == "intent":
                st.entries[obj["id"]] = Entry(obj["id"], obj["type"], obj["record"], obj.get("plan", []),
                                              expires_at=obj.get("expires_at"),
                                              executor=obj.get("executor") or "local",
                                              placement=obj.get("placement"), group=obj.get("group"))
            elif op in ("applied", "reverted", "revert_failed") and obj.get("id") in st.entries:
                e = st.entries[obj["id"]]
                if op == "applied":
                    e.applied, e.record = True, obj["record"]
                    e.expires_at = obj.get("expires_at") or e.expires_at
                elif op == "reverted":
                    e.reverted = True
                else:
                    e.failures.append(obj.get("error", ""))
            elif op == "closed":
                st.closed = True
        return st

    @contextmanager
    def locked(self, timeout: float | None = None) -> Iterator[None]:
        """Serialise reverts between the run, its watchdog and `chaoskit rollback`. Never waits forever: a lock
        held longer than `timeout` (a revert stuck in a kernel call) is a LedgerLockTimeout, reported as a
        failed revert, not a hung run."""
        fd = os.open(str(self.path) + ".lock", os.O_RDWR | os.O_CREAT, 0o600)
        try:
            timeout = LOCK_TIMEOUT_S if timeout is None else timeout
            deadline = time.monotonic() + timeout
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.monotonic() > deadline:
                        raise LedgerLockTimeout(f"{self.path}: another revert has held the ledger lock for "
                                                f"{timeout:g}s") from None
                    time.sleep(0.01)
            try:
                yield
            finally:
                fcntl.flock(fd, fcntl.LOCK_UN)
        finally:
            os.close(fd)

    def remove_lockfile(self) -> None:
        Path(str(self.path) + ".lock").unlink(missing_ok=True)

    def discard(self) -> None:
        """Delete a closed ledger and its side files (the run's journal keeps the history)."""
        if self.read().closed:
            for suffix in ("", ".lock", ".watchdog.log"):
                Path(str(self.path) + suffix).unlink(missing_ok=True)


def open_ledgers(directory: Path | None = None) -> list[Ledger]:
    """Every ledger in the state directory that is not closed."""
    d = directory or ledger_dir()
    return [Ledger(p) for p in sorted(d.glob("*.jsonl")) if not Ledger(p).read().closed]


def _fsync_dir(d: Path) -> None:
    fd = os.open(d, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
