"""kernel_log probe: count and last match of a regex over the kernel log lines that appeared since it started."""

from __future__ import annotations

import errno
import os
import re
import stat
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

from pydantic import Field, field_validator

from chaoskit.errors import PreflightError
from chaoskit.probes.base import Probe, ProbeSpecBase

KMSG = "/dev/kmsg"
RECORD_MAX = 8192  # a /dev/kmsg read must hold a whole record (messages are at most ~1 KiB plus metadata)
XID_RE = re.compile(r"NVRM: Xid \(PCI:[0-9a-fA-F:.]+[^)]*\): (\d+),")
_ESCAPE = re.compile(rb"\\x([0-9a-fA-F]{2})")


def unescape(raw: bytes) -> str:
    """/dev/kmsg writes bytes outside printable ASCII (and '\\') as \\xNN; `dmesg` shows them decoded."""
    return _ESCAPE.sub(lambda m: bytes([int(m[1], 16)]), raw).decode(errors="replace")


def parse_record(raw: bytes) -> tuple[int, str] | None:
    """(sequence number, message) of one /dev/kmsg record `prio,seq,usec,flags;message\\n[ KEY=value\\n]`."""
    header, sep, rest = raw.partition(b";")
    fields = header.split(b",")
    if not sep or len(fields) < 2 or not fields[1].isdigit():
        return None
    return int(fields[1]), unescape(rest.split(b"\n", 1)[0])


def xid_of(message: str) -> int | None:
    """The XID number of an NVRM Xid line, else None."""
    m = XID_RE.search(message)
    return int(m[1]) if m else None


@dataclass
class KmsgTail:
    """A non-blocking /dev/kmsg reader that starts after the newest record: only what appears later is read."""

    path: str = KMSG
    fd: int = -1
    last_seq: int | None = None
    lost: int = 0  # records overwritten in the ring buffer before they could be read

    def open(self) -> None:
        self.fd = os.open(self.path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        os.lseek(self.fd, 0, os.SEEK_END)

    def read(self) -> list[tuple[int, str]]:
        """Every record that appeared since the previous read."""
        out: list[tuple[int, str]] = []
        while True:
            try:
                raw = os.read(self.fd, RECORD_MAX)
            except BlockingIOError:
                return out
            except BrokenPipeError:  # EPIPE: the ring buffer wrapped past us; the next read goes on
                continue
            rec = parse_record(raw)
            if rec is None:
                continue
            if self.last_seq is not None and rec[0] > self.last_seq + 1:
                self.lost += rec[0] - self.last_seq - 1
            self.last_seq = rec[0]
            out.append(rec)

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


@dataclass
class FileTail:
    """A plain text log (e.g. /var/log/kern.log) read from its end on; a truncated or rotated file restarts."""

    path: str
    offset: int = 0
    inode: int = 0
    partial: bytes = b""
    lost: int = 0

    def open(self) -> None:
        st = os.stat(self.path)
        self.offset, self.inode = st.st_size, st.st_ino

    def read(self) -> list[tuple[int, str]]:
        st = os.stat(self.path)
        if st.st_ino != self.inode or st.st_size < self.offset:
            self.offset, self.inode, self.partial = 0, st.st_ino, b""
        with open(self.path, "rb") as f:
            f.seek(self.offset)
            data = f.read()
        self.offset += len(data)
        *lines, self.partial = (self.partial + data).split(b"\n")
        return [(0, line.decode(errors="replace")) for line in lines]

    def close(self) -> None:
        pass


@dataclass
class Window:
    """What the probe has seen: totals since it started and the newest match."""

    total: int = 0
    last_match: str | None = None
    xid: int | None = None


class KernelLogProbeSpec(ProbeSpecBase):
    type: Literal["kernel_log"]
    pattern: str = Field(min_length=1, description="regular expression (Python syntax) searched in each line's "
                                                   "message text, e.g. 'NVRM: Xid \\(PCI:0000:3b:00\\): 79,'")
    source: str = Field(KMSG, min_length=1, description="/dev/kmsg (default) or a plain text log file")
    expect_keys: ClassVar[tuple[str, ...]] = ("count", "total", "last_match", "lines", "xid", "lost")

    @field_validator("pattern")
    @classmethod
    def _pattern(cls, v: str) -> str:
        try:
            re.compile(v)
        except re.error as e:
            raise ValueError(f"pattern {v!r} is not a valid regular expression: {e}") from None
        return v


class KernelLogProbe(Probe):
    type: ClassVar[str] = "kernel_log"
    host_needs: ClassVar[frozenset[str]] = frozenset({"root", "kmsg"})
    summary: ClassVar[str] = "kernel log lines matching a regex since the previous sample (XIDs, OOM kills, ...)"
    Spec = KernelLogProbeSpec
    spec: KernelLogProbeSpec

    def __init__(self, spec: KernelLogProbeSpec):
        super().__init__(spec)
        self.regex = re.compile(spec.pattern)
        self.tail: KmsgTail | FileTail | None = None
        self.window = Window()

    def preflight(self) -> None:
        """Open the log and go to its end, so only lines that appear from now on count."""
        if self.tail is not None:
            return
        src = self.spec.source
        try:
            is_char = stat.S_ISCHR(os.stat(src).st_mode)
            tail: KmsgTail | FileTail = KmsgTail(src) if is_char else FileTail(src)
            tail.open()
        except OSError as e:
            hint = " (needs root, or kernel.dmesg_restrict = 0)" if src == KMSG and e.errno in (errno.EPERM, errno.EACCES) else ""
            raise PreflightError(f"kernel_log: cannot read {src}: {e.strerror}{hint}") from None
        self.tail = tail

    async def measure(self) -> dict[str, Any]:
        if self.tail is None:
            self.preflight()
        assert self.tail is not None
        lost_before = self.tail.lost
        records = self.tail.read()
        count = 0
        for _, message in records:
            if self.regex.search(message):
                count += 1
                self.window.last_match = message
                self.window.xid = xid_of(message)
        self.window.total += count
        return {"count": count, "total": self.window.total, "last_match": self.window.last_match,
                "xid": self.window.xid, "lines": len(records), "lost": self.tail.lost - lost_before}

    async def close(self) -> None:
        if self.tail is not None:
            self.tail.close()
            self.tail = None
