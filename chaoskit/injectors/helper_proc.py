"""Start a detached helper process marked by a token (it prints `ready`), find it again and stop it by that token."""

from __future__ import annotations

import importlib.util
import os
import select
import signal
import site
import subprocess
import sys
import time
from pathlib import Path
from typing import TypeVar

from pydantic import Field, model_validator

from chaoskit.injectors.base import Injector, RevertRecord, SpecT
from chaoskit.targets.process import ProcessRef, cmdline, find_by_token, is_alive, proc_ref


def command(module: str) -> list[str]:
    """How a helper module is run: as its file, without site (`python -S -P FILE`; env() gives it the import path
    site would have made), so only what it imports itself is imported: not the packages above it, as `python -m`
    would, nor the site hooks, and nothing beside the file shadows the standard library."""
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.origin:
        raise RuntimeError(f"helper module {module} not found")
    return [sys.executable, "-S", "-P", spec.origin]


def env(extra: dict[str, str] | None = None, base: dict[str, str] | None = None) -> dict[str, str]:
    """The environment (`base`, default ours) for a helper run by command(), `extra` on top: PYTHONPATH names
    where chaoskit and the site-packages directories this interpreter sees are (a helper runs without site, so
    no .pth file adds them)."""
    from chaoskit.paths import package_parent

    base = os.environ if base is None else base
    added = [p for p in sys.path if Path(p).name in ("site-packages", "dist-packages")]  # also those of .pth files
    paths = dict.fromkeys([str(package_parent()), *site.getsitepackages(), *added, base.get("PYTHONPATH", "")])
    return {**base, "PYTHONPATH": os.pathsep.join(p for p in paths if p), **(extra or {})}


def spawn(module: str | None, token: str, args: list[str], what: str, extra_env: dict[str, str] | None = None
          ) -> ProcessRef:
    """Run the helper `module` (an injector's `helper`) with `token *args` in its own session (`extra_env` on top
    of env()); wait for it to print `ready`."""
    if module is None:
        raise TypeError(f"{what}: the fault declares no helper module")
    proc = subprocess.Popen([*command(module), token, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            stdin=subprocess.DEVNULL, start_new_session=True, text=True, env=env(extra_env))
    line = proc.stdout.readline() if proc.stdout else ""
    if line.strip() != "ready":
        proc.kill()
        _, err = proc.communicate()
        raise RuntimeError(f"{what} failed to start (exit {proc.returncode}): {err.strip()[-500:]}")
    return started(proc.pid, token)


def started(pid: int, token: str) -> ProcessRef:
    """The helper just started as `pid`, read from its own /proc entry (not a scan of all) while its command line
    carries `token`; start time 0 (found by the token then) when it could not be read so."""
    ref = proc_ref(pid) if token in cmdline(pid) else None
    return ref if ref is not None else ProcessRef(pid, 0)


def marked(token: str | None, ref: ProcessRef | None) -> list[ProcessRef]:
    """The live processes carrying `token`: just the recorded one (`ref`) when the record has it (one /proc
    read instead of a scan of every process's command line), else all found by the token."""
    if not token:
        return []
    if ref is not None and ref.start_time:  # 0: spawn could not read it; scan by token
        return [ref] if is_alive(ref) and token in cmdline(ref.pid) else []
    return find_by_token(token)


def stop(token: str | None, grace_s: float = 5.0, ref: ProcessRef | None = None) -> None:
    """SIGTERM every process carrying the token (the recorded `ref` only, when given), SIGKILL what is left
    after `grace_s`."""
    stop_all(marked(token, ref), grace_s)


def stop_all(procs: list[ProcessRef], grace_s: float = 5.0) -> None:
    """SIGTERM them all at once, SIGKILL what is left after `grace_s`. Waits on pidfds: woken by each exit, and
    a reused PID is never signalled."""
    fds = [fd for fd in map(_pidfd, procs) if fd is not None]
    try:
        for fd in fds:
            _send(fd, signal.SIGTERM)
        for fd in _wait_exits(fds, grace_s):
            _send(fd, signal.SIGKILL)
    finally:
        for fd in fds:
            os.close(fd)


def _wait_exits(pidfds: list[int], timeout_s: float) -> list[int]:
    """Wait until every pidfd's process has exited or `timeout_s` passed; the pidfds still running."""
    poller = select.poll()
    for fd in pidfds:
        poller.register(fd, select.POLLIN)
    left, deadline = set(pidfds), time.monotonic() + timeout_s
    while left and (wait := deadline - time.monotonic()) > 0:
        for fd, _ in poller.poll(wait * 1000):
            poller.unregister(fd)
            left.discard(fd)
    return sorted(left)


def _pidfd(ref: ProcessRef) -> int | None:
    """A pidfd of that very process (opened, then its identity checked), or None when it is gone."""
    try:
        fd = os.pidfd_open(ref.pid)
    except ProcessLookupError:
        return None
    if is_alive(ref):
        return fd
    os.close(fd)
    return None


def _send(pidfd: int, sig: int) -> None:
    try:
        signal.pidfd_send_signal(pidfd, sig)
    except ProcessLookupError:
        pass


def running(token: str | None, ref: ProcessRef | None = None) -> bool:
    return any(is_alive(r) for r in marked(token, ref))


TOKEN = r"^chaoskit-[a-z-]+[0-9a-f]{32}$"  # what prepare makes: chaoskit-<kind>-<uuid4 hex>


class HelperRecord(RevertRecord):
    """A helper fault's record: the token its helper carries. Only a token of chaoskit's own shape reads back:
    revert stops every process whose command line carries it."""

    token: str = Field(pattern=TOKEN)


class HelperFiles(HelperRecord):
    """A helper's record that also names files the helper writes (status, journal): revert removes them, so they
    must be the helper's own, named after its token."""

    status: str | None = None
    journal: str | None = None

    @model_validator(mode="after")
    def _own_files(self) -> HelperFiles:
        for path in self.files():
            if not Path(path).name.startswith(f"{self.token}."):
                raise ValueError(f"{path} is not a file of helper {self.token}")
        return self

    def files(self) -> list[str]:
        return [p for p in (self.status, self.journal) if p]

    def remove_files(self) -> None:
        for path in map(Path, self.files()):
            path.unlink(missing_ok=True)
            path.with_suffix(".tmp").unlink(missing_ok=True)


HelperRecordT = TypeVar("HelperRecordT", bound=HelperRecord)


class HelperFault(Injector[SpecT, HelperRecordT]):
    """A fault that is a helper process found by the token in its record: revert stops it, observe sees it."""

    Record = HelperRecord

    @classmethod
    def revert(cls, record: HelperRecordT) -> None:
        stop(record.token)

    @classmethod
    def observe(cls, record: HelperRecordT) -> bool:
        return running(record.token)
