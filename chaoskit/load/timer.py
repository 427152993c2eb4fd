"""A microsecond wake-up for the event loop: a Linux timerfd armed at an absolute CLOCK_MONOTONIC time
(time.monotonic's clock) and watched by the loop like a socket (asyncio's own timers round to 1 ms). It also
learns how late wake-ups come (an idle virtual CPU can take milliseconds): `lead` is how early to wake
before a deadline that must be met, the rest being spent yielding to the loop."""

from __future__ import annotations

import asyncio
import ctypes
import os
import time
from collections.abc import Callable

CLOCK_MONOTONIC, TFD_NONBLOCK, TFD_CLOEXEC, TFD_TIMER_ABSTIME = 1, 0o4000, 0o2000000, 1
LEAD_MIN, LEAD_MAX, LEAD_DECAY = 0.0002, 0.002, 0.999  # lead: 2x the latest late wake-up, decaying to 0.2 ms


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


class _Itimerspec(ctypes.Structure):
    _fields_ = [("it_interval", _Timespec), ("it_value", _Timespec)]


_libc = ctypes.CDLL(None, use_errno=True)


class Alarm:
    """Calls `callback` from the loop at (or just after) the time given to `at`; one pending time at a time."""

    def __init__(self, loop: asyncio.AbstractEventLoop, callback: Callable[[], None]):
        fd = _libc.timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC)
        if fd < 0:
            raise OSError(ctypes.get_errno(), "timerfd_create")
        self.fd, self.loop, self.callback = fd, loop, callback
        self._spec = _Itimerspec()
        self._armed: float | None = None
        self.lead = LEAD_MAX  # until wake-ups prove punctual
        loop.add_reader(fd, self._fired)

    def at(self, when: float) -> None:
        """Wake at monotonic time `when` (replaces the pending time; a past time fires at once)."""
        if when == self._armed:
            return
        ns = max(1, int(when * 1e9))  # 0 would disarm
        self._spec.it_value.tv_sec, self._spec.it_value.tv_nsec = divmod(ns, 1_000_000_000)
        if _libc.timerfd_settime(self.fd, TFD_TIMER_ABSTIME, ctypes.byref(self._spec), None) < 0:
            raise OSError(ctypes.get_errno(), "timerfd_settime")
        self._armed = when

    def _fired(self) -> None:
        try:
            os.read(self.fd, 8)
        except BlockingIOError:
            return  # re-armed after it expired: not due yet
        if self._armed is not None:
            late = time.monotonic() - self._armed
            self.lead = min(LEAD_MAX, max(LEAD_MIN, 2 * late, self.lead * LEAD_DECAY))
        self._armed = None
        self.callback()

    def close(self) -> None:
        self.loop.remove_reader(self.fd)
        os.close(self.fd)
