"""How the GPU memory holder decides what to allocate: fixed amounts, a steady device level, ramps, holes.

Pure logic over a `DeviceMemory` (the CUDA driver in the holder process, a simulated device in tests); the
holder process calls `Holder.tick()` every 100 ms.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Literal, Protocol

GRANULE = 2 << 20  # allocations are rounded up to 2 MiB pages, as the driver does
MAX_CHUNK = 1 << 30  # bulk allocations go in pieces of at most 1 GiB, so a give-back can be fine-grained


class DeviceMemory(Protocol):
    def info(self) -> tuple[int, int]:
        """(free, total) bytes of the device now, every process's allocations included."""

    def alloc(self, nbytes: int) -> int | None:
        """A handle to nbytes of device memory, or None when the device has no room."""

    def free(self, handle: int) -> None: ...


def round_up(n: int) -> int:
    return -(-n // GRANULE) * GRANULE


@dataclass(frozen=True)
class Target:
    """What to hold. `kind` says what `value` is: own bytes, a share of total, or bytes to leave free.

    fixed: the holder takes that many bytes once (percent: of total; leave_free: free memory at start minus
    it) and keeps them. steady: the device's *used* level is the target (percent of total; total minus
    leave_free; used at start plus bytes), re-measured every tick and corrected both ways."""

    kind: Literal["bytes", "percent", "leave_free"]
    value: float
    hold: Literal["fixed", "steady"] = "fixed"
    ramp_s: float = 0.0

    def own_bytes(self, free: int, total: int) -> int:
        if self.kind == "bytes":
            return round_up(int(self.value))
        if self.kind == "percent":
            return round_up(int(self.value * total))
        return max(0, round_up(free - int(self.value)))

    def used_level(self, baseline_used: int, total: int) -> int:
        if self.kind == "bytes":
            return min(total, baseline_used + int(self.value))
        if self.kind == "percent":
            return int(self.value * total)
        return max(0, total - int(self.value))


@dataclass
class Correction:
    """One change the holder made: what it measured, what it aimed at, what it did (journaled)."""

    t: float
    device_used: int
    goal_used: int
    delta: int  # bytes allocated (+) or given back (-)
    held: int
    short: int = 0  # bytes it wanted but the device would not give

    def to_json(self) -> dict:
        return asdict(self)


@dataclass
class Holder:
    mem: DeviceMemory
    target: Target
    deadband: int = 0  # steady: no correction while |used - goal| <= this (default: 0.25% of total, >= 4 MiB)
    chunks: list[tuple[int, int]] = field(default_factory=list)  # (handle, bytes), oldest first
    t0: float = 0.0
    total: int = 0
    baseline_used: int = 0
    own_goal: int = 0  # fixed mode
    level_goal: int = 0  # steady mode
    short: int = 0  # bytes the last correction wanted but the device would not give

    @property
    def held(self) -> int:
        return sum(n for _, n in self.chunks)

    def start(self, now: float) -> None:
        free, self.total = self.mem.info()
        self.t0, self.baseline_used = now, self.total - free
        self.own_goal = self.target.own_bytes(free, self.total)
        self.level_goal = self.target.used_level(self.baseline_used, self.total)
        if not self.deadband:
            self.deadband = max(2 * GRANULE, int(self.total * 0.0025))

    def _ramp(self, now: float) -> float:
        r = self.target.ramp_s
        return 1.0 if r <= 0 else min(1.0, max(0.0, (now - self.t0) / r))

    def goal_used(self, now: float) -> int:
        """The device-used level a steady holder aims at now (the ramp goes from the level at start)."""
        return self.baseline_used + int((self.level_goal - self.baseline_used) * self._ramp(now))

    def tick(self, now: float) -> Correction | None:
        free, total = self.mem.info()
        used = total - free
        if self.target.hold == "fixed":
            want = round_up(int(self.own_goal * self._ramp(now)))
            delta, goal = want - self.held, used + (want - self.held)
            if delta < GRANULE:
                self.short = 0
                return None
        else:
            goal = self.goal_used(now)
            delta = goal - used
            if abs(delta) <= self.deadband:
                self.short = 0
                return None
            delta = max(delta, -self.held)  # cannot give back more than it holds
        before = self.held
        short = self.grow(delta) if delta > 0 else self.shrink(-delta)
        self.short = short
        if self.held == before:
            return None
        return Correction(now, used, goal, self.held - before, self.held, short)

    def grow(self, nbytes: int) -> int:
        """Allocate about nbytes in pieces; returns the bytes it could not get."""
        left, piece = round_up(nbytes), MAX_CHUNK
        while left > 0 and piece >= GRANULE:
            n = min(piece, left)
            handle = self.mem.alloc(n)
            if handle is None:
                piece //= 2  # the device is (nearly) full: try smaller pieces down to one page
                continue
            self.chunks.append((handle, n))
            left -= n
        return max(0, left)

    def shrink(self, nbytes: int) -> int:
        """Give back nbytes, newest chunks first, splitting the last one; returns the bytes not given back."""
        left = round_up(nbytes)
        while left > 0 and self.chunks:
            handle, n = self.chunks.pop()
            self.mem.free(handle)
            if n > left:  # keep the rest of this chunk: re-take it (a neighbour may win the race; next tick sees)
                self.grow(n - left)
                return 0
            left -= n
        return max(0, left)

    def release(self) -> None:
        while self.chunks:
            handle, _ = self.chunks.pop()
            self.mem.free(handle)


@dataclass(frozen=True)
class Fragmented:
    holes: int
    hole_size: int
    free_after: int  # device free bytes once the holes are open
    largest_alloc: int  # the largest single allocation that still succeeds (measured, not assumed)

    @property
    def largest_ratio(self) -> float:
        """largest_alloc / free_after: 1.0 = the holes do not limit one allocation; 1/holes = fully fragmented."""
        return self.largest_alloc / self.free_after if self.free_after else 0.0


def fragment(holder: Holder, holes: int, hole_size: int) -> Fragmented:
    """Leave free memory as `holes` separated holes of `hole_size`: allocate hole, spacer, hole, spacer ...,
    fill the rest, then free the holes. Raises ValueError when the device has no room for them."""
    mem, hole_size = holder.mem, round_up(hole_size)
    free, _ = mem.info()
    if holes * (hole_size + GRANULE) > free:
        raise ValueError(f"{holes} holes of {hole_size} bytes (+ spacers) need more than the {free} bytes free")
    hole_handles = []
    for _ in range(holes):
        h = mem.alloc(hole_size)
        s = mem.alloc(GRANULE)  # spacer: keeps this hole apart from the next
        if h is None or s is None:
            raise ValueError("the device refused an allocation while laying out the holes")
        hole_handles.append(h)
        holder.chunks.append((s, GRANULE))
    holder.grow(free)  # fill everything else (grow stops when even one page is refused)
    for h in hole_handles:
        mem.free(h)
    free_after, _ = mem.info()
    return Fragmented(holes, hole_size, free_after, largest_allocation(mem, free_after))


def largest_allocation(mem: DeviceMemory, upper: int) -> int:
    """Binary search (in pages) for the largest single allocation that succeeds; each try is freed at once."""
    lo, hi = 0, upper // GRANULE  # lo pages known to succeed, hi an upper bound
    while lo < hi:
        mid = (lo + hi + 1) // 2
        handle = mem.alloc(mid * GRANULE)
        if handle is None:
            hi = mid - 1
        else:
            mem.free(handle)
            lo = mid
    return lo * GRANULE
