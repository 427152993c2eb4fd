"""Per-run watchdog: a detached process that reverts the ledger if the chaoskit run dies without doing so.

`python -m chaoskit.engine.watchdog LEDGER` — waits on a pidfd of the run's process (no polling race with
PID reuse), exits quietly once the ledger is closed, and never reverts while the run is alive.
"""

from __future__ import annotations

import logging
import os
import select
import subprocess
import sys
import time
from pathlib import Path

from chaoskit.engine.ledger import Ledger
from chaoskit.engine.rollback import rollback
from chaoskit.targets.process import ProcessRef, is_alive, proc_ref

CHECK_CLOSED_EVERY_S = 0.5


def spawn(ledger: Ledger) -> ProcessRef:
    """Start the watchdog for this run, detached (own session, survives the parent), and record it."""
    log_path = str(ledger.path) + ".watchdog.log"
    with open(log_path, "ab") as log_file:
        proc = subprocess.Popen(
            [sys.executable, "-m", "chaoskit.engine.watchdog", str(ledger.path)],
            stdin=subprocess.DEVNULL, stdout=log_file, stderr=log_file, start_new_session=True, close_fds=True,
        )
    ref = proc_ref(proc.pid) or ProcessRef(proc.pid, 0)
    ledger.set_watchdog(ref)
    return ref


def _wait_for_owner(owner: ProcessRef, ledger: Ledger) -> bool:
    """Block until the owner dies (True) or the ledger is closed (False)."""
    try:
        pidfd = os.pidfd_open(owner.pid)
    except ProcessLookupError:
        return True
    try:
        if not is_alive(owner):  # the PID was reused before we opened the pidfd
            return True
        while True:
            ready, _, _ = select.select([pidfd], [], [], CHECK_CLOSED_EVERY_S)
            if ready:
                return True
            if ledger.read().closed:
                return False
            if not is_alive(owner):  # zombie not yet reaped also counts as dead
                return True
    finally:
        os.close(pidfd)


def watch(path: Path) -> int:
    ledger = Ledger(path)
    state = ledger.read()
    if state.owner is None:
        logging.error("ledger %s has no owner; nothing to watch", path)
        return 2
    if not _wait_for_owner(state.owner, ledger):
        return 0
    if ledger.read().closed:
        return 0
    t0 = time.monotonic()
    logging.warning("run %s (PID %d) died with faults applied; rolling back", state.run_id, state.owner.pid)
    result = rollback(ledger)
    for entry, error in result.failed:
        logging.error("could not revert #%d %s: %s (ledger kept open for `chaoskit rollback`)",
                      entry.id, entry.type, error)
    logging.warning("rollback %s in %.0f ms", "complete" if result.complete else "INCOMPLETE",
                    (time.monotonic() - t0) * 1000)
    return 0 if result.complete else 5


def main() -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s watchdog[%(process)d] %(levelname)s %(message)s")
    if len(sys.argv) != 2:
        print("usage: python -m chaoskit.engine.watchdog LEDGER", file=sys.stderr)
        return 2
    return watch(Path(sys.argv[1]))


if __name__ == "__main__":
    sys.exit(main())
