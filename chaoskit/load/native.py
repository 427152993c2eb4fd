"""The native sender (sender.c): built once with the system C compiler into a cache keyed by its source, then
driven in slices from a worker process: Python feeds the schedule and reports, C sends, reads and records."""

from __future__ import annotations

import ctypes
import resource
import socket
import time
from collections.abc import Callable, Iterable, Iterator
from functools import cache
from itertools import islice
from pathlib import Path
from urllib.parse import urlsplit

from chaoskit import cbuild
from chaoskit.errors import ChaoskitError
from chaoskit.load.recorder import METRICS, Recorder, layout
from chaoskit.load.spec import LoadSpec

SOURCE = Path(__file__).with_name("sender.c")
CFLAGS = ("-O2", "-shared", "-fPIC", "-Wall")
ERRORS = ("timeout", "connect", "http_status", "stream_error", "other", "stream_truncated")  # sender.c's E_* order
API = {"http": 0, "openai": 1, "openai-chat": 2, "triton": 3}
SLICE_S = 0.01  # the C loop hands back to Python this often (progress, windows, more of the schedule)
AHEAD_S, FILL, CHUNK = 0.1, 1024, 8192  # the schedule C holds: 0.1 s ahead, topped up <= 1024 at a time


class _Config(ctypes.Structure):
    _fields_ = [("family", ctypes.c_int), ("port", ctypes.c_int), ("addr", ctypes.c_ubyte * 16),
                ("n_payloads", ctypes.c_int), ("payloads", ctypes.POINTER(ctypes.c_char_p)),
                ("payload_lens", ctypes.POINTER(ctypes.c_int)),
                ("api", ctypes.c_int), ("stream", ctypes.c_int), ("cap", ctypes.c_int), ("max_conns", ctypes.c_int),
                ("timeout", ctypes.c_double), ("slo", ctypes.c_double * 4),
                ("counts", ctypes.c_void_p * len(METRICS)),
                ("counts_len", ctypes.c_int64), ("sub_bucket_mask", ctypes.c_int64),
                ("sub_bucket_half_count", ctypes.c_int64),
                ("unit_magnitude", ctypes.c_int), ("sub_bucket_half_count_magnitude", ctypes.c_int),
                ("lowest", ctypes.c_int64), ("highest", ctypes.c_int64)]


class _Stats(ctypes.Structure):
    _fields_ = [(k, ctypes.c_int64) for k in ("sent", "ok", "good", "late", "tokens", "in_flight")] + \
               [("errors", ctypes.c_int64 * len(ERRORS)), ("max_late", ctypes.c_double)]


def build() -> Path:
    """The shared library for this sender.c (compiled on first use); ChaoskitError when it cannot be."""
    try:
        return cbuild.build(SOURCE, "sender", CFLAGS, suffix=".so", libs=("-lm",))
    except cbuild.NoCompiler:
        raise ChaoskitError("the native sender needs a C compiler (apt install gcc), or use --sender python") from None
    except cbuild.CompileFailed as e:
        raise ChaoskitError(f"the native sender: {e}") from None


@cache
def _lib(path: str) -> ctypes.CDLL:
    lib = ctypes.CDLL(path)
    lib.ck_new.restype = ctypes.c_void_p
    lib.ck_new.argtypes = [ctypes.POINTER(_Config)]
    lib.ck_stats_of.restype = ctypes.POINTER(_Stats)
    lib.ck_stats_of.argtypes = [ctypes.c_void_p]
    lib.ck_warm.restype = None
    lib.ck_warm.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_double]
    lib.ck_run.restype = ctypes.c_int64
    lib.ck_run.argtypes = [ctypes.c_void_p, ctypes.c_double, ctypes.c_void_p, ctypes.c_int64, ctypes.c_double]
    lib.ck_add.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_double]
    lib.ck_free.argtypes = [ctypes.c_void_p]
    return lib


def choose(spec: LoadSpec, group_by: str | None = None) -> str:
    """'native' or 'python' for this spec (building the library when native is wanted); errors name the cause.
    group_by needs the python sender: sender.c parses only the headers that frame a response; so does
    stall_timeout: sender.c does not classify stalled or malformed streams (recorder.PYTHON_ONLY_KINDS)."""
    if group_by is not None:
        if spec.sender == "native":
            raise ChaoskitError(f"group_by {group_by} needs the python sender: the native sender (sender.c) does "
                                "not read response headers; use sender: python or auto")
        return "python"
    if spec.poison is not None:
        return "python"  # LoadSpec refuses poison with sender native
    if spec.stall_timeout is not None:
        if spec.sender == "native":
            raise ChaoskitError("stall_timeout needs the python sender: the native sender (sender.c) does not "
                                "tell stalled or malformed streams apart; use sender: python or auto")
        return "python"
    if spec.sender == "python" or (spec.sender == "auto" and spec.url.startswith("https://")):
        return "python"
    if spec.url.startswith("https://"):
        raise ChaoskitError("--sender native speaks plain http:// only; use --sender python (aiohttp) for https")
    try:
        build()
    except ChaoskitError:
        if spec.sender == "native":
            raise
        return "python"
    return "native"


def _raise_fd_limit() -> int:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        soft = hard
    return max(16, soft - 64)


class Sender:
    """One native sender: its connections, its config and the recorder its histograms count into."""

    def __init__(self, spec: LoadSpec, payloads: list[bytes], rec: Recorder):
        parts = urlsplit(spec.url)
        host, port = parts.hostname or "127.0.0.1", parts.port or 80
        try:
            family, _, _, _, sockaddr = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
        except OSError as e:
            raise ChaoskitError(f"cannot resolve {host}: {e}") from None
        self.lib, self.rec = _lib(str(build())), rec
        self._keep = [ctypes.create_string_buffer(p, len(p)) for p in payloads]
        cfg = _Config(family=family, port=port, n_payloads=len(payloads), api=API[spec.api],
                      stream=int(spec.stream), cap=spec.concurrency_cap or 0, max_conns=_raise_fd_limit(),
                      timeout=spec.timeout)
        packed = socket.inet_pton(family, sockaddr[0])
        ctypes.memmove(cfg.addr, packed, len(packed))
        self._ptrs = (ctypes.c_char_p * len(payloads))(*(ctypes.cast(b, ctypes.c_char_p) for b in self._keep))
        self._lens = (ctypes.c_int * len(payloads))(*(len(p) for p in payloads))
        cfg.payloads, cfg.payload_lens = self._ptrs, self._lens
        for j, m in enumerate(("e2e", "ttft", "itl", "tpot")):
            cfg.slo[j] = spec.slo.get(m, 0.0)
        for j, m in enumerate(METRICS):
            cfg.counts[j] = ctypes.addressof(rec.counts(m))
        for name, value in layout().items():
            setattr(cfg, name, value)
        self._cfg = cfg
        self.h = self.lib.ck_new(ctypes.byref(cfg))
        if not self.h:
            raise ChaoskitError("the native sender could not start (epoll/timerfd/memory)")
        self.stats = self.lib.ck_stats_of(self.h).contents

    def warm(self, n: int, timeout: float = 1.0) -> None:
        """Open up to n connections before the clock starts (waiting at most `timeout` for them)."""
        self.lib.ck_warm(self.h, n, timeout)

    def sync(self) -> None:
        """Copy the C counters into the recorder (the histograms are shared already)."""
        s, r = self.stats, self.rec
        r.sent, r.ok, r.good, r.late, r.tokens = s.sent, s.ok, s.good, s.late, s.tokens
        r.max_late_us = round(s.max_late * 1e6)
        r.errors = {k: s.errors[j] for j, k in enumerate(ERRORS) if s.errors[j]}

    def reset(self) -> None:
        """A new window: the recorder (in place, so the C side keeps its pointers) and the counters."""
        self.rec.reset()
        s = self.stats
        s.sent = s.ok = s.good = s.late = s.tokens = 0
        s.max_late = 0.0
        for j in range(len(ERRORS)):
            s.errors[j] = 0

    def run(self, offsets: Iterable[float], t0: float, tick: Callable[[], None],
            stopped: Callable[[], bool] | None = None) -> None:
        """Send each offset (seconds after monotonic t0), calling `tick` between slices, then wait for what is
        in flight (each request ends by its timeout at the latest). The schedule is handed over a little at a
        time, AHEAD_S ahead of the clock, so no refill pauses the sending for long. Once `stopped()` holds
        (checked after each tick) the unsent rest is dropped."""
        buf = (ctypes.c_double * CHUNK)()
        it: Iterator[float] = iter(offsets)
        pos = cnt = 0
        more = True
        while True:
            if more and (pos == cnt or buf[cnt - 1] < time.monotonic() - t0 + AHEAD_S):
                if pos:  # what is left goes to the front
                    ctypes.memmove(buf, ctypes.addressof(buf) + 8 * pos, 8 * (cnt - pos))
                    cnt, pos = cnt - pos, 0
                room = min(FILL, CHUNK - cnt)
                for off in islice(it, room):
                    buf[cnt] = off
                    cnt += 1
                    room -= 1
                more = room == 0  # fewer than asked for: the schedule has ended
            if pos == cnt and not more and self.stats.in_flight == 0:
                return
            pos += self.lib.ck_run(self.h, t0, ctypes.addressof(buf) + 8 * pos, cnt - pos, time.monotonic() + SLICE_S)
            tick()
            if stopped is not None and stopped():
                pos = cnt = 0
                more = False

    def close(self) -> None:
        if self.h:
            self.lib.ck_free(self.h)
            self.h = None

