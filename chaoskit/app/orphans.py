"""Before a command starts work: finish the ledgers of runs that died together with their watchdog."""

from __future__ import annotations

from dataclasses import dataclass

from chaoskit.engine.rollback import replay_orphans as replay_ledgers


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
