"""Per-run watchdog: a detached process that reverts the ledger if the chaoskit run dies without doing so.

`python -m chaoskit.engine.watchdog LEDGER` — leaves the job's session, process group and (as root) cgroups,
so a CI runner, systemd or Kubernetes killing the job's whole cgroup does not kill it too; says so in the
ledger (`watching`, the handshake the run waits for); waits on a pidfd of the run's process (no polling race
with PID reuse), exits quietly once the ledger is closed, and never reverts while the run is alive.
"""

from __future__ import annotations

import logging
import os
import select
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from chaoskit.engine.ledger import Entry, Ledger, LedgerLockTimeout, LedgerState
from chaoskit.engine.rollback import revert_entry, rollback
from chaoskit.targets.cgroups import cgroups_of, escape_to_roots, hierarchy_roots
from chaoskit.targets.process import ProcessRef, is_alive, proc_ref

CHECK_CLOSED_EVERY_S = 0.5
HANDSHAKE_S = 5.0


def spawn(ledger: Ledger, handshake_s: float = HANDSHAKE_S) -> tuple[ProcessRef, dict[str, Any]]:
    """Start the watchdog for this run, detached (own session, survives the parent), record it, and wait for
    its handshake. A watchdog that does not answer is killed and one more is tried; then WatchdogError."""
    procs_files = [str(r / "cgroup.procs") for r in hierarchy_roots()] if os.geteuid() == 0 else []
    for _ in range(2):
        log_path = str(ledger.path) + ".watchdog.log"
        with open(log_path, "ab") as log_file:
            proc = subprocess.Popen(
                [sys.executable, "-m", "chaoskit.engine.watchdog", str(ledger.path)],
                stdin=subprocess.DEVNULL, stdout=log_file, stderr=log_file, start_new_session=True, close_fds=True,
                preexec_fn=(lambda: _escape_now(procs_files)) if procs_files else None,
            )
        ref = proc_ref(proc.pid) or ProcessRef(proc.pid, 0)
        ledger.set_watchdog(ref)
        deadline = time.monotonic() + handshake_s
        while time.monotonic() < deadline and proc.poll() is None:
            info = ledger.read().watching
            if info is not None:
                return ref, info
            time.sleep(0.01)
        proc.kill()
        proc.wait()
    raise WatchdogError(f"the watchdog did not start watching within {handshake_s:g}s (log: {log_path})")


def _escape_now(procs_files: list[str]) -> None:
    """In the forked child, before exec: out of the job's cgroups at once, so a job kill that lands while the
    watchdog's Python starts up cannot take it (only plain syscalls here: the parent has threads)."""
    me = str(os.getpid()).encode()
    for path in procs_files:
        try:
            fd = os.open(path, os.O_WRONLY)
            try:
                os.write(fd, me)
            finally:
                os.close(fd)
        except OSError:
            pass  # the watchdog tries again itself and reports what it could not do


class WatchdogError(RuntimeError):
    pass


def _leave_job() -> dict[str, Any]:
    """Out of the job's cgroups (root only: into each hierarchy's root cgroup); the handshake's content."""
    if os.geteuid() != 0:
        moved, problems = [], ["not root: stays in the job's cgroups (a whole-cgroup kill takes it too)"]
    else:
        moved, problems = escape_to_roots(os.getpid())
    return {"pid": os.getpid(), "session": os.getsid(0), "escaped_to": moved, "problems": problems,
            "cgroups": cgroups_of(os.getpid())}


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
            state = ledger.read()
            if state.closed:
                return False
            _revert_expired(ledger, state)
            if not is_alive(owner):  # zombie not yet reaped also counts as dead
                return True
    finally:
        os.close(pidfd)


def _revert_expired(ledger: Ledger, state: LedgerState) -> None:
    """A fault past its maximum lifetime is reverted even though the run lives: the run may be hung."""
    now = time.time()
    expired = [e for e in state.pending() if e.expires_at is not None and now > e.expires_at]
    if not expired:
        return
    try:
        _revert_locked(ledger, state, expired)
    except LedgerLockTimeout as e:
        logging.error("could not revert expired faults: %s", e)


def _revert_locked(ledger: Ledger, state: LedgerState, expired: list[Entry]) -> None:
    with ledger.locked():
        for entry in expired:
            if ledger.read().entries[entry.id].reverted:
                continue
            logging.warning("fault #%d %s outlived its maximum lifetime while run %s (PID %d) lives; reverting",
                            entry.id, entry.type, state.run_id, state.owner.pid if state.owner else -1)
            error = revert_entry(ledger, entry)
            if error:
                logging.error("could not revert expired #%d %s: %s", entry.id, entry.type, error)


def watch(path: Path) -> int:
    ledger = Ledger(path)
    state = ledger.read()
    if state.owner is None:
        logging.error("ledger %s has no owner; nothing to watch", path)
        return 2
    info = _leave_job()
    for problem in info["problems"]:
        logging.warning("cgroup: %s", problem)
    ledger.watching(info)
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
