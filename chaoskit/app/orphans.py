"""Runs known from this host's ledgers: finish those that died together with their watchdog, list those in progress."""

from __future__ import annotations

import json
import socket
from dataclasses import dataclass
from pathlib import Path

from chaoskit.engine.ledger import Entry, LedgerState, open_ledgers
from chaoskit.engine.rollback import replay_orphans as replay_ledgers
from chaoskit.paths import state_dir


@dataclass(frozen=True)
class OrphanReplay:
    """One dead run's ledger, replayed: the faults reverted (id, type) and those that failed (id, type, why)."""

    run_id: str
    reverted: tuple[tuple[int, str], ...]
    failed: tuple[tuple[int, str, str], ...]


def replay_orphans() -> list[OrphanReplay]:
    return [OrphanReplay(state.run_id, tuple((e.id, e.type) for e in result.reverted),
                         tuple((e.id, e.type, why) for e, why in result.failed))
            for state, result in replay_ledgers()]


@dataclass(frozen=True)
class HeldFault:
    """A fault of a run that may be in effect: its ledger id and type, applied or only intended, and what it holds
    on the host, in words (Injector.holds, from its ledger record)."""

    id: int
    type: str
    applied: bool
    holds: tuple[str, ...]


@dataclass(frozen=True)
class LiveRun:
    """A run whose ledger is not closed: who runs it, since when (epoch), the faults that may be in effect."""

    host: str
    run_id: str
    experiment: str
    pid: int | None
    since: float | None
    faults: tuple[str, ...]  # `TYPE` applied, `TYPE (applying)` only intended
    state: str  # running | the owner is gone and what reverts its faults
    held: tuple[HeldFault, ...] = ()  # the same faults, newest first, with what each holds


def runs_in_progress() -> list[LiveRun]:
    """Every run of this host's state directory whose ledger is open, oldest first."""
    host, directory = socket.gethostname(), state_dir() / "ledgers"
    runs = []
    for ledger in open_ledgers(directory) if directory.is_dir() else []:  # a look: nothing is created
        st = ledger.read()
        faults = tuple(e.type if e.applied else f"{e.type} (applying)" for e in reversed(st.pending()))
        runs.append(LiveRun(host, st.run_id, st.experiment, st.owner.pid if st.owner else None,
                            _opened_at(ledger.path), faults, _liveness(st), tuple(map(held, st.pending()))))
    return sorted(runs, key=lambda r: r.since or 0.0)


def held(entry: Entry) -> HeldFault:
    """A ledger entry's fault and what it holds: its family's words (Injector.holds) or, for a family not
    installed here or a record that does not read back, the record's own fields."""
    from chaoskit.injectors import injector_class
    from chaoskit.injectors.holdings import summary

    try:
        cls = injector_class(entry.type)
        # a ledger-only type (no Record) is said by its fields as written
        holds = cls.holds(cls.from_ledger(entry.record)) if cls.Record is not None else summary(entry.record)
    except Exception as e:  # status lists every fault, whatever one family's words do
        holds = [*summary(entry.record), f"(the record's fields as written: {entry.type} did not describe it: "
                                         f"{type(e).__name__}: {e})"]
    if entry.executor != "local":
        holds = [_placed(entry.executor, entry.placement or {}), *holds]
    return HeldFault(entry.id, entry.type, entry.applied, tuple(holds))


def _placed(executor: str, placement: dict) -> str:
    """Where a fault applied through another executor is held: its node and pods (a helper pod's placement)."""
    pods = [f"{p.get('namespace')}/{p.get('pod')}" for p in (placement.get("targets") or [placement.get("target")])
            if isinstance(p, dict)]
    return f"through {executor}" + (f" on node {placement['node']}" if placement.get("node") else "") + (
        f", pods {', '.join(pods)}" if pods else "")


def _liveness(st: LedgerState) -> str:
    if st.owner_alive():
        return "running"
    if st.watchdog_alive():
        return "its process is gone; its watchdog reverts"
    return "its process and watchdog are gone: chaoskit rollback --all"


def _opened_at(path: Path) -> float | None:
    """The time of the ledger's `open` line (every line carries `t`)."""
    try:
        with open(path, encoding="utf-8") as f:
            t = json.loads(f.readline()).get("t")
    except (OSError, ValueError, AttributeError):
        return None
    return float(t) if isinstance(t, (int, float)) else None
