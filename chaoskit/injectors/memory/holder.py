"""The process behind host.memory_pressure: have the kernel populate N bytes, hold them (or hold available memory at
a goal), exit on SIGTERM or deadline.

`python chaoskit/injectors/memory/holder.py TOKEN BYTES UNTIL_EPOCH [CONFIG_JSON]` (run as a file: it imports
only the standard library, so it starts in milliseconds). TOKEN lets a fresh process find it again (revert by
marker). Memory is anonymous, in mappings of at most CHUNK bytes, populated a CHUNK at a time by the kernel:
madvise(MADV_POPULATE_WRITE) (Linux >= 5.14); where that is EINVAL, new chunks are mapped with MAP_POPULATE and
the rest of a partly used chunk is touched page by page. SIGTERM is honoured between chunks. `ready` is printed
once the memory is resident.

- Without CONFIG_JSON (or with one without `goal_available`): fixed, hold BYTES.
- With `goal_available`: hold the host's available memory at that many bytes. Available memory is MemAvailable
  plus the free pages on the kernel's per-CPU lists (`meminfo`). Every TICK_S the holder re-reads it; when it is
  more than `deadband` above the goal the holder populates more, when more than `deadband` below it gives memory
  back (MADV_DONTNEED / munmap, newest first). Never more than BYTES (the cap), never pushing available memory
  below `floor`. `ready` once the first correction has settled.
CONFIG_JSON `status` names a small JSON file rewritten (atomically) every tick: own bytes, last available memory,
corrections count and the last few corrections. $CHAOSKIT_MEMORY_POPULATE=populate_write|map_populate|touch
forces a method (tests of the fallbacks).
"""

from __future__ import annotations

import errno
import json
import mmap
import os
import signal
import sys
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

PAGE = mmap.PAGESIZE
CHUNK = 64 << 20
TICK_S = 0.1
SETTLE_TICKS = 50  # in hold mode `ready` comes at the latest this many ticks after the first population
MADV_POPULATE_WRITE = 23  # linux/mman-common.h, 5.14+
MADV_DONTNEED = 4
METHODS = ("populate_write", "map_populate", "touch")
KEEP_CORRECTIONS = 20
_ANON = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS


def percpu_free() -> int:
    """Bytes of free pages on the kernel's per-CPU lists (the `count:` of each pageset in /proc/zoneinfo). They are
    free, yet counted in neither MemFree nor MemAvailable; since Linux 6.7 a list grows while its CPU frees pages
    (on a 2-core 24 GiB VM up to ~1 GiB per CPU), so a process that gives back 512 MiB leaves MemAvailable where
    it was for seconds. 0 where /proc/zoneinfo cannot be read."""
    pages = 0
    try:
        with open("/proc/zoneinfo", "rb") as f:
            for line in f:
                if line.lstrip().startswith(b"count:"):
                    pages += int(line.split()[1])
    except OSError:
        return 0
    return pages * PAGE


def meminfo() -> tuple[int, int]:
    """(MemTotal, available memory) in bytes: available = MemAvailable + `percpu_free()`."""
    total = avail = 0
    with open("/proc/meminfo", "rb") as f:
        for line in f:
            if line.startswith(b"MemTotal:"):
                total = int(line.split()[1]) * 1024
            elif line.startswith(b"MemAvailable:"):
                avail = int(line.split()[1]) * 1024
                break
    return total, avail + percpu_free()


def _pages(n: int) -> int:
    return -(-n // PAGE) * PAGE


class Chunk:
    """One anonymous mapping and how much of it (a prefix) is resident."""

    def __init__(self, size: int, populate: bool = False):
        flags = _ANON | (mmap.MAP_POPULATE if populate else 0)
        self.buf = mmap.mmap(-1, size, flags=flags)
        self.resident = size if populate else 0


class Pages:
    """Anonymous memory held in chunks of at most CHUNK bytes, populated by the kernel; grows and shrinks at the end."""

    def __init__(self, method: str, stop: Callable[[], bool]):
        self.method, self.stop = method, stop
        self.chunks: list[Chunk] = []

    @property
    def held(self) -> int:
        return sum(c.resident for c in self.chunks)

    def grow_step(self, n: int) -> int:
        """Make up to min(n, CHUNK) more bytes resident (page-rounded); return how many. OSError ENOMEM propagates."""
        step = min(_pages(n), CHUNK)
        last = self.chunks[-1] if self.chunks else None
        if last is not None and last.resident < len(last.buf):
            step = min(step, len(last.buf) - last.resident)
            self._populate(last, step)
        elif self.method == "map_populate":
            self.chunks.append(Chunk(step, populate=True))
        else:
            self.chunks.append(Chunk(CHUNK))
            self._populate(self.chunks[-1], step)
        return step

    def grow(self, n: int) -> int:
        """Populate n more bytes a chunk at a time; stop early on SIGTERM. Return the bytes added."""
        added = 0
        while added < n and not self.stop():
            added += self.grow_step(n - added)
        return added

    def _populate(self, c: Chunk, n: int) -> None:
        off = c.resident
        if self.method == "populate_write":
            try:
                c.buf.madvise(MADV_POPULATE_WRITE, off, n)
                c.resident += n
                return
            except OSError as e:
                if e.errno != errno.EINVAL:  # ENOMEM, EFAULT (SIGBUS/SIGSEGV ranges): real failures
                    raise
                self.method = "map_populate"  # kernel < 5.14: new chunks by MAP_POPULATE, this range by touch
        for p in range(off, off + n, PAGE):
            c.buf[p] = 1
        c.resident += n

    def shrink(self, n: int) -> int:
        """Give back up to n bytes (page-rounded), newest first. Return the bytes released."""
        n, removed = _pages(n), 0
        while removed < n and self.chunks:
            last = self.chunks[-1]
            step = min(last.resident, n - removed)
            if step == last.resident:
                last.buf.close()
                self.chunks.pop()
            else:
                last.buf.madvise(MADV_DONTNEED, last.resident - step, step)
                last.resident -= step
            removed += step
        return removed

    def release(self) -> None:
        self.shrink(self.held)


def pick_method() -> str:
    forced = os.environ.get("CHAOSKIT_MEMORY_POPULATE", "")
    if forced in METHODS:
        return forced
    return "populate_write" if sys.platform.startswith("linux") else "touch"


class Config(NamedTuple):
    """What the holder is started with (its argv's JSON: HolderRecord.config): its status file, and to hold
    available memory at a goal, the goal, floor and deadband in bytes (no goal: it holds a fixed size)."""

    status: str | None = None
    goal_available: int | None = None
    floor: int | None = None
    deadband: int | None = None


class Correction(NamedTuple):
    """One correction of a hold (the status file's last_corrections): when, available memory before, the goal,
    the bytes added (negative: given back), held and available memory after, and what stopped a growth short."""

    t: float
    mem_available: int
    goal: int
    delta: int
    held: int
    after: int
    bound: str | None = None

    def to_json(self) -> dict[str, float | str]:
        return {"t": self.t, "mem_available": self.mem_available, "goal": self.goal, "delta": self.delta,
                "held": self.held, "after": self.after, **({"bound": self.bound} if self.bound else {})}


class Status:
    """The small JSON file an injector's observe_details reads: the holder's config, its state, the latest
    corrections."""

    def __init__(self, config: Config, nbytes: int):
        self.path = Path(config.status) if config.status else None
        hold = config.goal_available is not None
        self.base = {"mode": "hold" if hold else "fixed", "cap" if hold else "bytes": nbytes,
                     **{k: v for k, v in config._asdict().items() if k != "status" and v is not None}}
        self.corrections = 0
        self.last: deque[Correction] = deque(maxlen=KEEP_CORRECTIONS)

    def correction(self, c: Correction) -> None:
        self.corrections += 1
        self.last.append(c)

    def write(self, state: str, pages: Pages, avail: int | None = None, **extra: Any) -> None:
        if self.path is None:
            return
        data = {**self.base, "state": state, "pid": os.getpid(), "method": pages.method, "held": pages.held,
                "mem_available": avail if avail is not None else meminfo()[1], "corrections": self.corrections,
                "last_corrections": [c.to_json() for c in self.last], "t": round(time.time(), 3), **extra}
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(data))
        os.replace(tmp, self.path)


class Hold:
    """The controller of the hold mode: keep available memory at `goal` within `deadband`, bounded by cap and
    floor."""

    def __init__(self, pages: Pages, status: Status, goal: int, cap: int, floor: int, deadband: int):
        self.pages, self.status = pages, status
        self.goal, self.cap, self.floor, self.deadband = goal, cap, floor, deadband
        self.bound: str | None = None  # what stopped the last growth short of the goal: cap, floor, ENOMEM

    def room(self, avail: int) -> int:
        """Bytes the holder may still add: towards the goal, under the cap, above the floor."""
        return min(avail - self.goal, self.cap - self.pages.held, avail - self.floor)

    def correct(self) -> int:
        """One correction if available memory is off the goal by more than the deadband; return it after."""
        _, avail = meminfo()
        err, before, t = avail - self.goal, avail, time.time()
        delta, why = 0, None
        if err > self.deadband:
            # grow a chunk at a time, re-reading available memory after each: others may allocate meanwhile
            while not self.pages.stop() and (room := self.room(avail)) >= PAGE:
                try:
                    delta += self.pages.grow_step(room)
                except OSError as e:
                    if e.errno != errno.ENOMEM:
                        raise
                    why = "ENOMEM"
                    break
                _, avail = meminfo()
            if why is None and avail - self.goal > self.deadband and not self.pages.stop():
                why = "cap" if self.cap - self.pages.held < PAGE else "floor"
        elif err < -self.deadband and self.pages.held:
            delta = -self.pages.shrink(-err)
            _, avail = meminfo()
        if delta == 0 and why == self.bound:  # on target, or still held back by the same bound: nothing new
            return avail
        self.bound = why
        self.status.correction(Correction(round(t, 3), before, self.goal, delta, self.pages.held, avail, why))
        return avail

    def settled(self, avail: int) -> bool:
        return abs(avail - self.goal) <= self.deadband or self.bound is not None


def main(argv: list[str]) -> int:
    _token, nbytes, until = argv[0], int(argv[1]), float(argv[2])
    config = Config(**json.loads(argv[3])) if len(argv) > 3 else Config()
    stop = False

    def _stop(*_: object) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C at the terminal is the engine's to handle
    pages = Pages(pick_method(), lambda: stop)
    hold = config.goal_available is not None
    status = Status(config, nbytes)
    ctl: Hold | None = None
    t0 = time.monotonic()
    try:
        if hold:
            assert config.goal_available is not None and config.floor is not None and config.deadband is not None
            ctl = Hold(pages, status, config.goal_available, nbytes, config.floor, config.deadband)
            avail = ctl.correct()
            populate_s = time.monotonic() - t0
            for _ in range(SETTLE_TICKS):
                if stop or ctl.settled(avail):
                    break
                time.sleep(TICK_S)
                avail = ctl.correct()
        else:
            pages.grow(max(nbytes, PAGE))  # all of it, unless SIGTERM came first
            populate_s = time.monotonic() - t0
            avail = None
    except OSError as e:
        print(f"memory holder: {pages.held} of {nbytes} bytes resident, then: {e}", file=sys.stderr,
              flush=True)
        pages.release()
        return 3
    if stop:  # SIGTERM before ready: give everything back, no `ready`
        pages.release()
        return 0
    status.write("holding", pages, avail, populate_s=round(populate_s, 4))
    print("ready", flush=True)
    next_t = time.monotonic()
    while not stop and time.time() < until:
        next_t += TICK_S
        time.sleep(max(0.0, next_t - time.monotonic()))
        if ctl is not None and not stop:
            status.write("holding", pages, ctl.correct(), populate_s=round(populate_s, 4))
    pages.release()
    status.write("released", pages, populate_s=round(populate_s, 4))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
