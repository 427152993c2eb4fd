"""exec: the user's own fault as commands (argv lists, never a shell): apply, revert (ledgered first), observe."""

from __future__ import annotations

import os
import re
import select
import shlex
import shutil
import signal
import subprocess
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Annotated, Any, ClassVar, Literal

from pydantic import AfterValidator, BeforeValidator, Field, WithJsonSchema, field_validator

from chaoskit.errors import PreflightError
from chaoskit.injectors.base import Injector, RevertRecord
from chaoskit.model.types import Duration, StrictModel

TOKEN_VAR = "CHAOSKIT_EXEC_TOKEN"  # in the apply command's environment: how revert finds what is left of it
DEFAULT_TIMEOUT_S = 20.0  # under a step's default 30 s apply limit, so the command's own error is the one shown
TAIL_CHARS = 500  # of stderr (or stdout) in an error message and in the journal
KILL_WAIT_S = 2.0
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def _as_text(value: object) -> object:
    """A number (what a whole `{target.replica_pid}` placeholder becomes) as its text; anything else unchanged."""
    return str(value) if isinstance(value, int | float) and not isinstance(value, bool) else value


def _argv_in(value: object) -> object:
    if isinstance(value, str):
        raise ValueError(f"give a list of program and arguments, e.g. ['touch', '/tmp/flag'], not a command line "
                         f"(got {value!r}; nothing here runs through a shell)")
    if value == []:
        raise ValueError("an empty list: give the program and its arguments")
    return value


def _argv_ok(argv: list[str]) -> list[str]:
    if not argv[0]:
        raise ValueError("the program (the first item) is an empty string")
    if any("\0" in a for a in argv):
        raise ValueError("an argument holds a NUL character")
    return argv


Text = Annotated[str, BeforeValidator(_as_text), WithJsonSchema({"type": ["string", "number"]})]
Argv = Annotated[list[Text], BeforeValidator(_argv_in), AfterValidator(_argv_ok), Field(min_length=1)]


class ExecSpec(StrictModel):
    type: Literal["exec"]
    apply: Argv = Field(description="the command that injects the fault: program and arguments, no shell; a "
                                    "non-zero exit or the timeout fails the step (and the revert still runs)")
    revert: Argv = Field(description="the command that undoes it; written to the ledger before apply runs, so the "
                                     "watchdog and `chaoskit rollback` run it too. Must succeed when there is "
                                     "nothing to undo: it may run more than once, or after an apply that failed")
    observe: Argv | None = Field(None, description="optional: exit 0 = the fault is in effect (journaled after "
                                                   "apply and before revert; after revert it must not exit 0)")
    env: dict[str, Text] = Field(default_factory=dict, description="extra environment variables for the three "
                                "commands (kept in the ledger, so no secrets)")
    cwd: str | None = Field(None, min_length=1, description="working directory of the commands (default: where "
                                                            "chaoskit runs); recorded as an absolute path")
    timeout: Duration = Field(DEFAULT_TIMEOUT_S, gt=0, description="limit for each command; its process group is "
                                                                   "killed after it")

    @field_validator("env")
    @classmethod
    def _env_names(cls, v: dict[str, str]) -> dict[str, str]:
        for name, value in v.items():
            if not _ENV_NAME.match(name):
                raise ValueError(f"environment variable name {name!r}: letters, digits and _, not starting with a "
                                 "digit")
            if name == TOKEN_VAR:
                raise ValueError(f"{TOKEN_VAR} is set by chaoskit")
            if "\0" in value:
                raise ValueError(f"environment variable {name}: its value holds a NUL character")
        return v


@dataclass
class Outcome:
    """How one command ended: its exit code (None: killed at the timeout), how long it ran, its output's tails."""

    code: int | None
    seconds: float
    stdout: str
    stderr: str

    def tail(self) -> str:
        if self.stderr:
            return f"stderr: {self.stderr}"
        return f"stdout: {self.stdout}" if self.stdout else "no output"


class CommandFailed(RuntimeError):
    """A command of an exec fault exited non-zero, timed out or could not start."""


def _tail(f: IO[bytes]) -> str:
    """The end of a command's output on one line (its lines joined by ' | ')."""
    f.seek(0, os.SEEK_END)
    f.seek(max(0, f.tell() - 4 * TAIL_CHARS))
    text = " | ".join(line.strip() for line in f.read().decode(errors="replace").splitlines() if line.strip())
    return text if len(text) <= TAIL_CHARS else "…" + text[-TAIL_CHARS:]


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def run_command(what: str, argv: list[str], env: dict[str, str], cwd: str | None, timeout: float,
                token: str | None = None) -> Outcome:
    """Run argv in its own session (no shell, stdin closed), output to files (a child left running cannot hold
    a pipe open); at the timeout its whole process group is killed. CommandFailed if it cannot start."""
    full_env = {**os.environ, **env, **({TOKEN_VAR: token} if token else {})}
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        t0 = time.monotonic()
        try:
            proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=err, env=full_env, cwd=cwd,
                                    start_new_session=True, close_fds=True)
        except OSError as e:
            raise CommandFailed(f"{what} command {shlex.join(argv)} could not start: {e}") from None
        try:
            code: int | None = proc.wait(timeout)
        except subprocess.TimeoutExpired:
            _kill_group(proc.pid)
            proc.wait()
            code = None
        return Outcome(code, time.monotonic() - t0, _tail(out), _tail(err))


def run_checked(what: str, argv: list[str], record: ExecRecord, token: str | None = None) -> Outcome:
    """run_command with the record's env, cwd and timeout; CommandFailed unless it exits 0."""
    timeout = record.timeout
    o = run_command(what, argv, record.env, record.cwd, timeout, token)
    if o.code is None:
        raise CommandFailed(f"{what} command {shlex.join(argv)} timed out after {timeout:g}s (its process group "
                            f"was killed); {o.tail()}")
    if o.code != 0:
        raise CommandFailed(f"{what} command {shlex.join(argv)} exited {o.code} after {o.seconds:.1f}s; {o.tail()}")
    return o


def _environ_has(pid: int, marker: bytes) -> bool:
    try:
        return marker in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return False


def stop_leftovers(token: str) -> list[int]:
    """SIGKILL every process whose environment carries this fault's token (an apply still running: the run was
    killed mid-apply, or it outlived its timeout in a new session), and wait for them; their PIDs. Each is held
    by a pidfd while it is checked, so a reused PID is never signalled."""
    marker, me, killed = f"{TOKEN_VAR}={token}".encode(), os.getpid(), []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == me:
            continue
        try:
            pidfd = os.pidfd_open(int(entry.name))
        except OSError:
            continue
        try:
            if _environ_has(int(entry.name), marker):
                signal.pidfd_send_signal(pidfd, signal.SIGKILL)
                select.select([pidfd], [], [], KILL_WAIT_S)  # readable once it has exited
                killed.append(int(entry.name))
        except ProcessLookupError:
            pass
        finally:
            os.close(pidfd)
    return killed


def resolve_program(what: str, argv: list[str], cwd: Path, env: dict[str, str]) -> list[str]:
    """argv with its program as an absolute path (what the ledger keeps, so a revert in another directory or
    environment runs the same program): a name is looked up on PATH (env's PATH if it sets one), a relative path
    in cwd. PreflightError naming it if it is not there or not executable."""
    prog = argv[0]
    if "/" in prog:
        path = cwd / prog
        if not path.is_file() or not os.access(path, os.X_OK):
            why = "is not executable" if path.is_file() else "does not exist"
            raise PreflightError(f"exec: {what}: {prog} {why}" + (f" (in {cwd})" if not prog.startswith("/") else ""))
        return [str(path), *argv[1:]]
    search = os.pathsep.join(os.get_exec_path({**os.environ, **env}))
    found = shutil.which(prog, path=search)
    if found is None:
        raise PreflightError(f"exec: {what}: program '{prog}' not found on PATH ({search})")
    return [os.path.abspath(found), *argv[1:]]


class ExecRecord(RevertRecord):
    """exec's record: the commands as resolved at prepare (absolute programs), their environment, directory and
    limit, and the token its apply's processes carry in their environment (revert kills what still has it)."""

    apply: list[str] = Field(min_length=1)
    revert: list[str] = Field(min_length=1)
    observe: list[str] | None = None
    env: dict[str, str] = Field(default_factory=dict)
    cwd: str | None = None
    timeout: float = Field(gt=0)
    token: str | None = Field(None, pattern=r"^[0-9a-f]{32}$")
    applied_in_s: float | None = None  # how long its apply command ran (set by apply)


class Exec(Injector[ExecSpec, ExecRecord]):
    type: ClassVar[str] = "exec"
    summary: ClassVar[str] = "your own commands (argv, no shell): apply, revert (ledgered before apply), observe"
    Spec = ExecSpec
    Record = ExecRecord
    spec: ExecSpec

    def _cwd(self) -> Path:
        return Path(self.spec.cwd or ".").absolute()

    def _commands(self) -> dict[str, list[str] | None]:
        """apply, revert and observe with their programs resolved (PreflightError if one cannot be)."""
        cwd, env = self._cwd(), self.spec.env
        out: dict[str, list[str] | None] = {}
        for what in ("apply", "revert", "observe"):
            argv = getattr(self.spec, what)
            out[what] = None if argv is None else resolve_program(what, argv, cwd, env)
        return out

    def preflight(self) -> None:
        if not self._cwd().is_dir():
            raise PreflightError(f"exec: cwd {self._cwd()} is not a directory")
        self._commands()

    def plan(self) -> list[str]:
        try:
            cmds = self._commands()
        except PreflightError:
            cmds = {k: getattr(self.spec, k) for k in ("apply", "revert", "observe")}
        where = f" in {self._cwd()}" + (f" with {', '.join(sorted(self.spec.env))} set" if self.spec.env else "")
        lines = [f"run {shlex.join(cmds['apply'] or [])}{where} (limit {self.spec.timeout:g}s each command)",
                 f"revert: run {shlex.join(cmds['revert'] or [])} (in the ledger before apply runs; also after a "
                 "failed apply)"]
        if cmds["observe"]:
            lines.append(f"observe: run {shlex.join(cmds['observe'])} (exit 0 = in effect)")
        return lines

    def prepare(self) -> ExecRecord:
        return ExecRecord(**self._commands(), env=dict(self.spec.env), cwd=str(self._cwd()),
                          timeout=self.spec.timeout, token=uuid.uuid4().hex)

    def apply(self, record: ExecRecord) -> ExecRecord:
        o = run_checked("apply", record.apply, record, token=record.token)
        return record.model_copy(update={"applied_in_s": round(o.seconds, 3)})

    @classmethod
    def revert(cls, record: ExecRecord) -> None:
        r = record
        if r.token:
            stop_leftovers(r.token)
        run_checked("revert", r.revert, record)

    @classmethod
    def observe(cls, record: ExecRecord) -> bool:
        return bool(cls.observe_details(record)["in_effect"])

    @classmethod
    def observe_details(cls, record: ExecRecord) -> dict[str, Any]:
        argv = record.observe
        if not argv:
            return {"in_effect": None, "observe": "no observe command"}
        o = run_command("observe", argv, record.env, record.cwd, record.timeout)
        if o.code is None:
            raise CommandFailed(f"observe command {shlex.join(argv)} timed out after {record.timeout:g}s; "
                                f"{o.tail()}")
        return {"in_effect": o.code == 0, "exit_code": o.code, "ms": round(o.seconds * 1000, 1),
                "stdout": o.stdout, "stderr": o.stderr}
