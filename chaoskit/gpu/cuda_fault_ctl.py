"""The CUDA fault interposer (cuda_fault.c): its build, the environment that loads it, and its control file.

Standard library only (a bare GPU machine runs bench/gpu_check.py with it). The control file is a fixed layout
both sides map: a header (magic, version, the armed switch, and when the arming expires: Unix seconds, 0 for
never), one rule per call kind (share in parts per million, the CUresult to return, a delay in microseconds), then
the counters the interposer adds to on every call while armed. Past its expiry an armed file acts as disarmed in
every process, so a fault whose run and watchdog both died still ends by itself, like every other fault's helper.
"""

from __future__ import annotations

import fcntl
import math
import mmap
import os
import struct
import time
from dataclasses import dataclass
from pathlib import Path

from chaoskit import cbuild

ENV = "CHAOSKIT_CUDA_FAULT"
SOURCE = Path(__file__).with_name("cuda_fault.c")
MAGIC, VERSION = 0x43464B43, 2
KINDS = ("alloc", "launch", "sync")
_HEADER = struct.Struct("<4I")
_RULE = struct.Struct("<IiII")
_COUNTS = struct.Struct("<4Q")
SIZE = _HEADER.size + len(KINDS) * (_RULE.size + _COUNTS.size)
_ARMED_AT, _EXPIRES_AT = 8, 12  # offsets of the header's `armed` and `expires` words
_RULES_AT = _HEADER.size
_COUNTS_AT = _RULES_AT + len(KINDS) * _RULE.size


@dataclass(frozen=True)
class Rule:
    """What the interposer does to one kind of call while armed: fail `share` of them with `error`, delay each."""

    share: float = 0.0
    error: int = 0
    delay_s: float = 0.0

    def packed(self) -> bytes:
        return _RULE.pack(round(self.share * 1_000_000), self.error, round(self.delay_s * 1_000_000), 0)


@dataclass(frozen=True)
class Counts:
    """Calls of one kind the process(es) made while the control file was armed, and the failed and delayed ones
    (a disarmed interposer writes nothing there)."""

    calls: int
    failed: int
    delayed: int


def build() -> Path:
    """The interposer library, compiled into the cache on first use (cbuild.NoCompiler / CompileFailed)."""
    return cbuild.build(SOURCE, "libchaoskit-cudafault", ("-shared", "-fPIC", "-O2"), ".so", ("-ldl",))


def create(path: Path) -> None:
    """A disarmed control file, whole from the start (written aside, then renamed into place); FileExistsError
    if there is one (processes may have it mapped)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
    try:
        os.write(fd, _HEADER.pack(MAGIC, VERSION, 0, 0) + bytes(SIZE - _HEADER.size))
    finally:
        os.close(fd)
    try:
        os.link(tmp, path)  # atomic, and refuses an existing file
    finally:
        os.unlink(tmp)


def environment(library: Path, control: Path, env: dict[str, str]) -> dict[str, str]:
    """`env` with the interposer preloaded (ahead of any LD_PRELOAD already there) and its control file named."""
    preload = " ".join(p for p in (str(library), env.get("LD_PRELOAD", "")) if p)
    return {**env, "LD_PRELOAD": preload, ENV: str(control)}


def named_by(pid: int) -> str | None:
    """The control file a process was started with ($CHAOSKIT_CUDA_FAULT in its initial environment)."""
    try:
        env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return None
    prefix = ENV.encode() + b"="
    return next((e[len(prefix):].decode() for e in env if e.startswith(prefix)), None)


WRAP_PREFIX = "wrap-"  # control files `chaoskit cuda-wrap` made for a command it started (and holds a lock on)


def hold(path: Path) -> int:
    """A shared lock on the control file, on a descriptor the wrapped command inherits: held while any process
    of it lives (sweep() removes a wrap's file once no one holds it). The descriptor."""
    fd = os.open(path, os.O_RDONLY)
    fcntl.flock(fd, fcntl.LOCK_SH)
    os.set_inheritable(fd, True)
    return fd


def sweep(directory: Path, older_than_s: float = 60.0) -> list[Path]:
    """Remove the control files of wrapped commands that have ended: `chaoskit cuda-wrap` execs its command, so
    nothing is left to remove them then. A file is its wrap's (named WRAP_PREFIX...), over `older_than_s` old (a
    wrap between creating its file and starting its command keeps it), and no process holds its lock any more.
    The files removed."""
    removed = []
    for f in directory.glob(f"{WRAP_PREFIX}*.ctl"):
        if _age(f) <= older_than_s:
            continue
        try:
            fd = os.open(f, os.O_RDONLY)
        except OSError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            f.unlink()
            removed.append(f)
        except OSError:  # held: its command still runs (or it went meanwhile)
            pass
        finally:
            os.close(fd)
    return removed


def _age(path: Path) -> float:
    try:
        return time.time() - path.stat().st_mtime
    except OSError:
        return 0.0


class Control:
    """An open control file; arm() and disarm() take effect at the interposed process's next call."""

    def __init__(self, path: Path):
        self.path = path
        with open(path, "r+b") as f:
            if os.fstat(f.fileno()).st_size < SIZE:
                raise ValueError(f"{path}: not a CUDA fault control file (too short)")
            self._map = mmap.mmap(f.fileno(), SIZE)
        magic, version, _, _ = _HEADER.unpack_from(self._map, 0)
        if (magic, version) != (MAGIC, VERSION):
            self.close()
            raise ValueError(f"{path}: not a CUDA fault control file of version {VERSION}")

    def __enter__(self) -> Control:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._map.close()

    @property
    def armed(self) -> bool:
        """Switched on and not expired: what the interposer acts on."""
        on, expires = struct.unpack_from("<2I", self._map, _ARMED_AT)
        return on != 0 and (expires == 0 or time.time() < expires)

    @property
    def expires_at(self) -> int:
        """When the arming expires (Unix seconds), 0 for never."""
        return struct.unpack_from("<I", self._map, _EXPIRES_AT)[0]

    def arm(self, rules: dict[str, Rule], until: float | None = None) -> None:
        """Write every kind's rule (kinds not named: none) and the expiry (`until`, Unix time, rounded up to the
        second; None: never), then the switch."""
        for i, kind in enumerate(KINDS):
            self._map[_RULES_AT + i * _RULE.size:_RULES_AT + (i + 1) * _RULE.size] = rules.get(kind, Rule()).packed()
        struct.pack_into("<I", self._map, _EXPIRES_AT, math.ceil(until) if until is not None else 0)
        struct.pack_into("<I", self._map, _ARMED_AT, 1)
        self._map.flush()

    def disarm(self) -> None:
        """The switch first (calls go through from the next one on), then the expiry and the rules."""
        struct.pack_into("<I", self._map, _ARMED_AT, 0)
        struct.pack_into("<I", self._map, _EXPIRES_AT, 0)
        self._map[_RULES_AT:_COUNTS_AT] = bytes(_COUNTS_AT - _RULES_AT)
        self._map.flush()

    def rules(self) -> dict[str, Rule]:
        out = {}
        for i, kind in enumerate(KINDS):
            ppm, error, delay_us, _ = _RULE.unpack_from(self._map, _RULES_AT + i * _RULE.size)
            out[kind] = Rule(ppm / 1_000_000, error, delay_us / 1_000_000)
        return out

    def counts(self) -> dict[str, Counts]:
        out = {}
        for i, kind in enumerate(KINDS):
            calls, failed, delayed, _ = _COUNTS.unpack_from(self._map, _COUNTS_AT + i * _COUNTS.size)
            out[kind] = Counts(calls, failed, delayed)
        return out
