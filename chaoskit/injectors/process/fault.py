"""process.signal: SIGSTOP (revert SIGCONT) or kill processes chosen by PID, name or parent (`child_of`).

Also the process selection other injectors share (process.cpu_throttle, process.memory_limit): `pid`, `name`,
`child_of` [+ `name`], as functions and as the `ProcessTargets` spec fields."""

from __future__ import annotations

import os
import re
import signal
import time
from pathlib import Path
from typing import Any, ClassVar, Literal, Self

import psutil
from pydantic import Field, field_validator, model_validator

from chaoskit.errors import PreflightError
from chaoskit.injectors.base import NODE_EXECUTORS, Injector, NodeHelper, RevertRecord
from chaoskit.model.types import StrictModel
from chaoskit.targets.cgroups import Hierarchy
from chaoskit.targets.kube import KubeNodeSelector
from chaoskit.targets.local import ProcessTarget
from chaoskit.targets.process import ProcessRef, cmdline, find_by_name, is_alive, proc_ref, proc_state

_ALLOWED_SIGNALS = ("SIGSTOP", "SIGTERM", "SIGKILL", "SIGINT", "SIGHUP", "SIGUSR1", "SIGUSR2", "SIGQUIT")


class ProcessSignalSpec(StrictModel):
    type: Literal["process.signal"]
    pid: int | list[int] | None = Field(None, description="target PID(s)")
    name: str | None = Field(None, min_length=1, description="regex on the process name (comm); with child_of, "
                                                             "among that PID's descendants")
    child_of: int | None = Field(None, gt=0, description="descendants (recursive) of this PID, e.g. "
                                                         "'{target.replica_pid}'; narrowed by name if given")
    kubernetes: KubeNodeSelector | None = Field(None, description="every process of the chosen pods' container (each "
                                                              "signalled on its node, through a helper pod)")
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

    @field_validator("pid")
    @classmethod
    def _pids(cls, v: int | list[int] | None) -> int | list[int] | None:
        return check_pids(v)

    @field_validator("name")
    @classmethod
    def _regex(cls, v: str | None) -> str | None:
        return check_regex(v)

    @model_validator(mode="after")
    def _one_target(self) -> ProcessSignalSpec:
        check_selector(self.pid, self.name, self.child_of, self.kubernetes)
        return self


def check_pids(v: int | list[int] | None) -> int | list[int] | None:
    if v is not None and (v == [] or any(p <= 0 for p in ([v] if isinstance(v, int) else v))):
        raise ValueError("PIDs are positive integers (and a list needs at least one)")
    return v


def check_regex(pattern: str | None) -> str | None:
    if pattern is not None:
        try:
            re.compile(pattern)
        except re.error as e:
            raise ValueError(f"not a valid regular expression: {e}") from None
    return pattern


# Which target fields may go together: (pid, name, child_of, kubernetes given) -> allowed.
_SELECTORS = {
    (True, False, False, False): "pid",
    (False, True, False, False): "name",
    (False, False, True, False): "child_of",
    (False, True, True, False): "child_of + name",
    (False, False, False, True): "kubernetes",
}
_NO_KUBE = object()  # the spec has no kubernetes: target


def check_selector(pid: object, name: object, child_of: object, kubernetes: object = _NO_KUBE,
                   cgroup: object = None, options: str | None = None) -> None:
    """ValueError unless the target is exactly one of: pid; name; child_of (optionally narrowed by name); and,
    for a spec that has the field, kubernetes; and for one that says so in `options`, cgroup."""
    kube = kubernetes is not _NO_KUBE and kubernetes is not None
    given = (pid is not None, name is not None, child_of is not None, kube)
    if given not in _SELECTORS or (cgroup is not None and any(given)):
        fields = ("pid", "name", "child_of", "kubernetes", "cgroup")
        what = ", ".join(f for f, g in zip(fields, (*given, cgroup is not None), strict=True) if g) or "none"
        if options is None:
            options = "pid, name, child_of (optionally with name), or kubernetes" if kubernetes is not _NO_KUBE \
                else "pid, name, or child_of (optionally with name)"
        raise ValueError(f"give exactly one target: {options}; got {what}")


def descendants(root: int) -> list[ProcessRef]:
    """Live children, grandchildren ... of `root` (not `root` itself, nor this process), by PID. psutil leaves out
    a "child" older than `root` (a reused PID)."""
    try:
        tree = psutil.Process(root).children(recursive=True)
    except psutil.Error:
        return []
    refs = (proc_ref(p.pid) for p in tree if p.pid != os.getpid())
    return sorted((r for r in refs if r is not None and is_alive(r)), key=lambda r: r.pid)


def select_processes(pid: int | list[int] | None, name: str | None, child_of: int | None = None,
                     full_cmdline: bool = False, allow_host: bool = False) -> list[ProcessRef]:
    """The running processes a selector means. Explicit PIDs are returned as given (preflight refuses protected
    ones loudly); matches by name or parent leave out PID 1 and chaoskit's own tree unless `allow_host`."""
    if pid is not None:
        refs = [proc_ref(p) for p in ([pid] if isinstance(pid, int) else pid)]
        return [r for r in refs if r is not None]
    if child_of is not None:
        found = descendants(child_of)
        if name is not None:
            rx = re.compile(name)
            found = [r for r in found if rx.search(" ".join(cmdline(r.pid)) if full_cmdline else r.comm)]
    else:
        found = find_by_name(name, full=full_cmdline)  # type: ignore[arg-type]
    if not allow_host:
        protected = protected_pids()
        found = [r for r in found if r.pid not in protected]
    return found


def describe_selector(pid: int | list[int] | None, name: str | None, child_of: int | None) -> str:
    if pid is not None:
        return f"PID {pid}" if isinstance(pid, int) else f"PIDs {', '.join(map(str, pid))}"
    if child_of is not None:
        return f"descendants of PID {child_of}" + (f" named /{name}/" if name is not None else "")
    return f"name /{name}/"


class ProcessTargets(StrictModel):
    """The target fields of a spec whose processes are chosen by `pid`, `name` or `child_of` [+ `name`]."""

    pid: int | list[int] | None = Field(None, description="target process(es); moved into a dedicated cgroup")
    name: str | None = Field(None, min_length=1, description="regex on process names (comm); with child_of, "
                                                             "among that PID's descendants")
    child_of: int | None = Field(None, gt=0, description="descendants (recursive) of this PID, e.g. "
                                                         "'{target.replica_pid}'; narrowed by name if given")
    full_cmdline: bool = Field(False, description="match `name` against the whole command line")
    allow_host: bool = Field(False, description="allow PID 1 and chaoskit's own ancestors")

    @field_validator("pid")
    @classmethod
    def _pids(cls, v: int | list[int] | None) -> int | list[int] | None:
        return check_pids(v)

    @field_validator("name")
    @classmethod
    def _regex(cls, v: str | None) -> str | None:
        return check_regex(v)

    @model_validator(mode="after")
    def _one_target(self) -> Self:
        check_selector(self.pid, self.name, self.child_of)
        return self

    def select(self) -> list[ProcessRef]:
        return select_processes(self.pid, self.name, self.child_of, self.full_cmdline, self.allow_host)

    def describe(self) -> str:
        return describe_selector(self.pid, self.name, self.child_of)


class CgroupTargets(ProcessTargets):
    """ProcessTargets, or a whole cgroup: an existing one (`cgroup`), or each chosen pod's container cgroup."""

    cgroup: str | None = Field(None, min_length=1, description="instead of processes: an existing cgroup (relative "
                                                               "to the controller's hierarchy root, e.g. "
                                                               "system.slice/vllm.service) whose own limit is set, "
                                                               "and restored on revert")
    kubernetes: KubeNodeSelector | None = Field(None, description="the chosen pods' container cgroups (each limited "
                                                                "on its node, through a helper pod)")

    @field_validator("cgroup")
    @classmethod
    def _relative(cls, v: str | None) -> str | None:
        return check_cgroup_path(v)

    @model_validator(mode="after")
    def _one_target(self) -> Self:
        cgroup_alone = self.cgroup is not None and all(
            v is None for v in (self.pid, self.name, self.child_of, self.kubernetes))
        if not cgroup_alone:
            check_selector(self.pid, self.name, self.child_of, self.kubernetes, self.cgroup,
                           options="pid, name, child_of (optionally with name), cgroup, or kubernetes")
        return self

    def describe(self) -> str:
        if self.cgroup is not None:
            return f"cgroup {self.cgroup}"
        if self.kubernetes is not None:
            return self.kubernetes.describe()
        return super().describe()


def check_cgroup_path(v: str | None) -> str | None:
    """A cgroup given by path: relative to the hierarchy's root and inside it."""
    if v is not None and (v.startswith("/") or ".." in Path(v).parts or Path(v) == Path(".")):
        raise ValueError(f"a cgroup path relative to the hierarchy's root, without '..' (got '{v}')")
    return v


def check_cgroup_target(who: str, hier: Hierarchy, cgroup: Path, allow_host: bool) -> None:
    """PreflightError unless `cgroup` exists and, without allow_host, holds neither PID 1 nor chaoskit's own
    process tree (a limit on it limits them too)."""
    if not cgroup.is_dir():
        raise PreflightError(f"{who}: cgroup {cgroup} does not exist")
    if allow_host:
        return
    for pid in sorted(protected_pids()):
        try:
            home = hier.cgroup_of(pid)
        except PreflightError:
            continue
        if home is not None and (home == cgroup or cgroup in home.parents):
            raise PreflightError(f"{who}: cgroup {cgroup} holds PID {pid} (init or chaoskit's own process tree); "
                                 "set allow_host: true to force")


def check_targets(who: str, spec: ProcessTargets, refs: list[ProcessRef], what: str, verb: str) -> None:
    """PreflightError unless `child_of` is running, `refs` (what `spec` selects, `what` in words) is not empty
    and, without allow_host, holds no protected process."""
    if spec.child_of is not None and proc_ref(spec.child_of) is None:
        raise PreflightError(f"{who}: child_of: no running process with PID {spec.child_of}")
    if not refs:
        raise PreflightError(f"{who}: no running process matches {what}")
    if not spec.allow_host:
        refuse_protected(who, refs, verb)


def refuse_protected(who: str, refs: list[ProcessRef], verb: str = "target") -> None:
    """PreflightError if any target is PID 1 or chaoskit's own process tree."""
    protected = protected_pids()
    bad = [r.pid for r in refs if r.pid in protected]
    if bad:
        raise PreflightError(f"{who}: refusing to {verb} PID {bad[0]} (init or chaoskit's own process tree); "
                             "set allow_host: true to force")


def protected_pids() -> set[int]:
    """PID 1, chaoskit and its ancestors (the shell, the CI runner)."""
    me = psutil.Process()
    return {1, me.pid, *(p.pid for p in me.parents())}


def _wait_state(targets: list[ProcessRef], done: Any, timeout: float = 1.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and not all(done(proc_state(t.pid)) for t in targets):
        time.sleep(0.001)


class SignalRecord(RevertRecord):
    """process.signal's record: the signal and the processes it went to (before apply: those it will go to)."""

    signal: str
    targets: list[ProcessRef] = Field(default_factory=list)


class ProcessSignal(Injector[ProcessSignalSpec, SignalRecord]):
    independent_revert: ClassVar[bool] = True
    executors: ClassVar[frozenset[str]] = NODE_EXECUTORS
    target_field: ClassVar[str | None] = "kubernetes"
    node_helper: ClassVar[NodeHelper] = NodeHelper(capabilities=("KILL", "SYS_PTRACE"))  # signals to other users
    type: ClassVar[str] = "process.signal"
    host_needs: ClassVar[frozenset[str]] = frozenset({"signals"})
    summary: ClassVar[str] = "SIGSTOP processes (revert: SIGCONT) or kill them, by PID or name"
    Spec = ProcessSignalSpec
    spec: ProcessSignalSpec
    Record = SignalRecord

    def resolve_target(self) -> ProcessTarget:
        s = self.spec
        refs = select_processes(s.pid, s.name, s.child_of, s.full_cmdline, s.allow_host)
        if s.pid is None and s.select == "one":
            refs = sorted(refs, key=lambda r: r.start_time)[:1]
        return ProcessTarget(self._what(), tuple(refs))

    def _targets(self) -> list[ProcessRef]:
        return list(self.target_as(ProcessTarget).processes)

    def _what(self) -> str:
        return describe_selector(self.spec.pid, self.spec.name, self.spec.child_of)

    def preflight(self) -> None:
        if self.spec.child_of is not None and proc_ref(self.spec.child_of) is None:
            raise PreflightError(f"process.signal: child_of: no running process with PID {self.spec.child_of}")
        refs = self._targets()
        if not refs:
            raise PreflightError(f"process.signal: no running process matches {self._what()}")
        if not self.spec.allow_host:
            refuse_protected("process.signal", refs, "signal")

    def plan(self) -> list[str]:
        refs = self._targets()
        revert = "SIGCONT on revert" if self.spec.signal == "SIGSTOP" else "not restarted on revert"
        if not refs:
            return [f"send {self.spec.signal} to {self._what()} (none running now)"]
        return [f"send {self.spec.signal} to PID {r.pid} ({r.comm}); {revert}" for r in refs]

    def prepare(self) -> SignalRecord:
        return SignalRecord(signal=self.spec.signal, targets=self._targets())

    def apply(self, record: SignalRecord) -> SignalRecord:
        sig = signal.Signals[record.signal]
        done = []
        for ref in record.targets:
            if is_alive(ref):
                try:
                    os.kill(ref.pid, sig)
                    done.append(ref)
                except ProcessLookupError:
                    pass
        if not done:
            raise RuntimeError("process.signal: every target exited before it could be signalled")
        if sig is signal.SIGSTOP:  # signals are asynchronous: applied means actually stopped
            _wait_state(done, lambda st: st in ("T", "t", None))
        return record.model_copy(update={"targets": done})

    @classmethod
    def revert(cls, record: SignalRecord) -> None:
        r = record
        if r.signal != "SIGSTOP":
            return  # a terminated process is not ours to restart
        for ref in r.targets:
            if is_alive(ref):
                try:
                    os.kill(ref.pid, signal.SIGCONT)
                except ProcessLookupError:
                    pass
        _wait_state(r.targets, lambda st: st not in ("T", "t"))

    def ended_processes(self, record: SignalRecord) -> list[ProcessRef]:
        """The processes a terminating signal goes to."""
        return [] if record.signal == "SIGSTOP" else list(record.targets)

    def watched_processes(self, record: SignalRecord) -> list[ProcessRef]:
        """The processes stopped (those signalled); none for a terminating signal, whose exit is the fault."""
        return list(record.targets) if record.signal == "SIGSTOP" else []

    @classmethod
    def observe(cls, record: SignalRecord) -> bool:
        r = record
        if r.signal == "SIGSTOP":
            return any(proc_state(t.pid) == "T" and is_alive(t) for t in r.targets)
        return False  # a terminating signal is an event: nothing stays in effect to take back
