"""process.signal: SIGSTOP (revert SIGCONT) or kill processes chosen by PID or name."""

from __future__ import annotations

import os
import signal
import time
from typing import Any, ClassVar, Literal

from pydantic import Field, field_validator, model_validator

from chaoskit.errors import PreflightError
from chaoskit.injectors.base import Injector
from chaoskit.spec.types import StrictModel
from chaoskit.targets.process import ProcessRef, find_by_name, is_alive, parent_pid, proc_ref, proc_state

_ALLOWED_SIGNALS = ("SIGSTOP", "SIGTERM", "SIGKILL", "SIGINT", "SIGHUP", "SIGUSR1", "SIGUSR2", "SIGQUIT")


class ProcessSignalSpec(StrictModel):
    type: Literal["process.signal"]
    pid: int | None = Field(None, gt=0, description="target PID")
    name: str | None = Field(None, min_length=1, description="regex on the process name (comm)")
    full_cmdline: bool = Field(False, description="match `name` against the whole command line")
    select: Literal["all", "one"] = Field("all", description="signal every match, or only the oldest")
    signal: str = Field("SIGSTOP", description="SIGSTOP (revert: SIGCONT) or a terminating signal")
    allow_host: bool = Field(False, description="allow PID 1 and chaoskit's own ancestors")

    @field_validator("signal")
    @classmethod
    def _signal(cls, v: str) -> str:
        name = v.upper() if v.upper().startswith("SIG") else "SIG" + v.upper()
        if name not in _ALLOWED_SIGNALS:
            raise ValueError(f"signal must be one of {', '.join(_ALLOWED_SIGNALS)} (got '{v}')")
        return name

    @model_validator(mode="after")
    def _one_target(self) -> ProcessSignalSpec:
        if (self.pid is None) == (self.name is None):
            raise ValueError("give exactly one of 'pid' or 'name'")
        return self


def _protected_pids() -> set[int]:
    """PID 1, chaoskit and its ancestors (the shell, the CI runner)."""
    pids: set[int] = {1}
    pid: int | None = os.getpid()
    while pid and pid > 1 and pid not in pids:
        pids.add(pid)
        pid = parent_pid(pid)
    return pids


def _wait_state(targets: list[dict[str, Any]], done: Any, timeout: float = 1.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and not all(done(proc_state(t["pid"])) for t in targets):
        time.sleep(0.001)


class ProcessSignal(Injector):
    type: ClassVar[str] = "process.signal"
    summary: ClassVar[str] = "SIGSTOP processes (revert: SIGCONT) or kill them, by PID or name"
    Spec = ProcessSignalSpec
    spec: ProcessSignalSpec

    def _targets(self) -> list[ProcessRef]:
        s = self.spec
        if s.pid is not None:
            ref = proc_ref(s.pid)
            refs = [ref] if ref is not None else []
        else:
            refs = find_by_name(s.name, full=s.full_cmdline)  # type: ignore[arg-type]
            if not s.allow_host:
                protected = _protected_pids()
                refs = [r for r in refs if r.pid not in protected]
            if s.select == "one":
                refs = sorted(refs, key=lambda r: r.start_time)[:1]
        return refs

    def preflight(self) -> None:
        refs = self._targets()
        what = f"PID {self.spec.pid}" if self.spec.pid else f"name /{self.spec.name}/"
        if not refs:
            raise PreflightError(f"process.signal: no running process matches {what}")
        if not self.spec.allow_host:
            protected = _protected_pids()
            bad = [r.pid for r in refs if r.pid in protected]
            if bad:
                raise PreflightError(f"process.signal: refusing to signal PID {bad[0]} (init or chaoskit's own "
                                     "process tree); set allow_host: true to force")

    def plan(self) -> list[str]:
        refs = self._targets()
        revert = "SIGCONT on revert" if self.spec.signal == "SIGSTOP" else "not restarted on revert"
        if not refs:
            return [f"send {self.spec.signal} to processes matching {self.spec.name or self.spec.pid} "
                    "(none running now)"]
        return [f"send {self.spec.signal} to PID {r.pid} ({r.comm}); {revert}" for r in refs]

    def prepare(self) -> dict[str, Any]:
        return {"signal": self.spec.signal, "targets": [r.to_json() for r in self._targets()]}

    def apply(self, record: dict[str, Any]) -> dict[str, Any]:
        sig = signal.Signals[record["signal"]]
        done = []
        for t in record["targets"]:
            ref = ProcessRef.from_json(t)
            if is_alive(ref):
                try:
                    os.kill(ref.pid, sig)
                    done.append(t)
                except ProcessLookupError:
                    pass
        if not done:
            raise RuntimeError("process.signal: every target exited before it could be signalled")
        if sig is signal.SIGSTOP:  # signals are asynchronous: applied means actually stopped
            _wait_state(done, lambda st: st in ("T", "t", None))
        return {**record, "targets": done}

    @classmethod
    def revert(cls, record: dict[str, Any]) -> None:
        if record.get("signal") != "SIGSTOP":
            return  # a terminated process is not ours to restart
        for t in record.get("targets", []):
            ref = ProcessRef.from_json(t)
            if is_alive(ref):
                try:
                    os.kill(ref.pid, signal.SIGCONT)
                except ProcessLookupError:
                    pass
        _wait_state(record.get("targets", []), lambda st: st not in ("T", "t"))

    @classmethod
    def observe(cls, record: dict[str, Any]) -> bool:
        if record.get("signal") == "SIGSTOP":
            return any(proc_state(t["pid"]) == "T" and is_alive(ProcessRef.from_json(t))
                       for t in record.get("targets", []))
        return False  # a terminating signal is an event: nothing stays in effect to take back
