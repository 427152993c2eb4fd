"""Replay a ledger: revert what is pending, newest first, retrying; close the ledger only when all is undone."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from chaoskit.engine.ledger import Entry, Ledger, LedgerLockTimeout, LedgerState, open_ledgers
from chaoskit.executors import LOCAL, Executor, UnknownExecutor, get_executor
from chaoskit.injectors import Injector, injector_class

log = logging.getLogger(__name__)

RETRIES = 3
RETRY_DELAY_S = 0.2
MAX_PARALLEL_REVERTS = 16


@dataclass
class RollbackResult:
    reverted: list[Entry] = field(default_factory=list)
    failed: list[tuple[Entry, str]] = field(default_factory=list)

    @property
    def complete(self) -> bool:
        return not self.failed


def revert_entry(ledger: Ledger, entry: Entry, retries: int = RETRIES) -> str | None:
    """Revert one entry with retries, through the executor that applied it; returns None on success, else the
    last error (also in the ledger)."""
    error = revert_unmarked(ledger, entry, retries)
    if error is None:
        ledger.reverted(entry.id)
    return error


def revert_unmarked(ledger: Ledger, entry: Entry, retries: int = RETRIES) -> str | None:
    """revert_entry without the `reverted` mark, which the caller writes (a batch's marks in one fsync) once
    this returns None: the fault is reverted and observed gone by then."""
    error = ""
    for attempt in range(1, retries + 1):
        try:
            executor = get_executor(entry.executor)
            executor.revert(entry.type, entry.record, entry.placement)
            if _still_in_effect(executor, entry):  # reconcile: reverted means observed gone
                raise RuntimeError("still in effect after revert (observe() sees it)")
            return None
        except UnknownExecutor as e:
            error = str(e)
        except KeyError:
            error = f"unknown fault type '{entry.type}' (ledger written by a newer chaoskit?)"
        except Exception as e:  # a revert must never crash the rollback of the others
            error = f"{type(e).__name__}: {e}"
        log.warning("revert of #%d %s failed (attempt %d/%d): %s", entry.id, entry.type, attempt, retries, error)
        ledger.revert_failed(entry.id, error)
        if attempt < retries:
            time.sleep(RETRY_DELAY_S * attempt)
    return error


def _still_in_effect(executor: Executor, entry: Entry) -> bool:
    """observe() after a revert; a fault that cannot be observed any more (its namespace gone) is gone."""
    try:
        return bool(executor.observe(entry.type, entry.record, entry.placement))
    except Exception as e:
        log.info("observe after revert failed (%s: %s): counted as gone", type(e).__name__, e)
        return False


def rollback(ledger: Ledger, close: bool = True,
             on_revert: Callable[[Entry, str | None], None] | None = None) -> RollbackResult:
    """Revert every pending entry in reverse order; close the ledger if (and only if) all succeeded.
    A ledger lock nobody releases (a revert stuck elsewhere) fails every pending entry: loud, never a hang."""
    try:
        return _rollback_locked(ledger, close, on_revert)
    except LedgerLockTimeout as e:
        return RollbackResult(failed=[(entry, str(e)) for entry in ledger.read().pending()])


def _rollback_locked(ledger: Ledger, close: bool,
                     on_revert: Callable[[Entry, str | None], None] | None) -> RollbackResult:
    result = RollbackResult()
    with ledger.locked():
        state = ledger.read()
        if state.closed:
            return result
        for batch in batches(state.pending()):
            for entry, error in _revert_batch(ledger, batch):
                if error is None:
                    result.reverted.append(entry)
                else:
                    result.failed.append((entry, error))
                if on_revert:
                    on_revert(entry, error)
        if close and result.complete:
            ledger.close()
    if close and result.complete:
        ledger.remove_lockfile()
    return result


def batches(pending: list[Entry]) -> list[list[Entry]]:
    """The pending entries (newest first) in the order they are reverted: consecutive entries of one `parallel`
    block whose faults revert independently form one batch, reverted at once; every other entry is a batch
    of its own, so faults that stack are still undone newest first."""
    out: list[list[Entry]] = []
    for entry in pending:
        if out and _joins(out[-1][-1], entry):
            out[-1].append(entry)
        else:
            out.append([entry])
    return out


def _joins(prev: Entry, entry: Entry) -> bool:
    return entry.group is not None and entry.group == prev.group and _independent(entry) and _independent(prev)


def _independent(entry: Entry) -> bool:
    cls = _injector(entry.type)
    return cls is not None and cls.independent_revert


def _revert_batch(ledger: Ledger, batch: list[Entry]) -> list[tuple[Entry, str | None]]:
    """Revert a batch at once; the reverted marks go into the ledger together (one fsync), each only after its
    fault was reverted and observed gone: a crash before the write leaves them pending, to be reverted again."""
    if len(batch) == 1:
        return [(batch[0], revert_entry(ledger, batch[0]))]
    _revert_many(batch)
    with ThreadPoolExecutor(max_workers=min(MAX_PARALLEL_REVERTS, len(batch))) as pool:
        errors = list(pool.map(lambda e: revert_unmarked(ledger, e), batch))
    ledger.reverted_many([e.id for e, error in zip(batch, errors, strict=True) if error is None])
    return list(zip(batch, errors, strict=True))


def _revert_many(batch: list[Entry]) -> None:
    """One call for the local faults of a kind that reverts many at once (`revert_many`: one nft transaction for
    every table). A speed-up only: each fault is then reverted (a no-op when gone) and observed on its own."""
    by_type: dict[str, list[Entry]] = {}
    for entry in batch:
        if entry.executor == LOCAL:
            by_type.setdefault(entry.type, []).append(entry)
    for type_name, entries in by_type.items():
        cls = _injector(type_name)
        if cls is None or len(entries) < 2:
            continue
        try:
            cls.revert_many([cls.from_ledger(e.record) for e in entries])
        except Exception as e:  # each fault's own revert still runs, with its retries
            log.info("revert_many of %d %s failed (%s: %s); reverting one by one", len(entries), type_name,
                     type(e).__name__, e)


def _injector(type_name: str) -> type[Injector] | None:
    try:
        return injector_class(type_name)
    except KeyError:
        return None


def replay_orphans(directory: Path | None = None) -> list[tuple[LedgerState, RollbackResult]]:
    """Replay every unfinished ledger whose run and watchdog are both dead (a whole job killed, a reboot);
    a ledger whose run or watchdog still lives is theirs to finish. Every chaoskit command starts with this."""
    out = []
    for ledger in open_ledgers(directory):
        state = ledger.read()
        if state.closed or state.owner_alive() or state.watchdog_alive():
            continue
        out.append((state, rollback(ledger)))
    return out
