"""The plain (CI) log never goes back in time: a sample is stamped when its verdict is known."""

from __future__ import annotations

import io
import time

from rich.console import Console

from chaoskit.model.events import Recovered, Sample, StateChanged
from chaoskit.ui import PlainView


def test_a_slow_sample_printed_after_a_fast_one_is_not_stamped_earlier():
    buf = io.StringIO()
    view = PlainView(Console(file=buf, width=200))
    base = time.mktime((2026, 12, 3, 6, 17, 13, 0, 0, -1))
    # the slow probe started at :13.0 and answered after 1.5 s; the fast one started at :14.0, took 10 ms
    view(Sample(t=base + 1.0, probe="fast", phase="during", verdict="ok", values={"v": 1}, duration_ms=10.0))
    view(Sample(t=base, probe="slow", phase="during", verdict="ok", values={"v": 2}, duration_ms=1500.0))
    stamps = [line.split()[0] for line in buf.getvalue().splitlines()]
    assert stamps == ["06:17:14", "06:17:14"], buf.getvalue()
    assert "ok after 1500 ms" in buf.getvalue()


def test_samples_checked_together_print_in_time_order():
    """The before and after checks take every probe's sample at once and record them together, in probe order,
    when the slowest answers: a fast probe's line must not be stamped before the slow one's above it."""
    buf = io.StringIO()
    view = PlainView(Console(file=buf, width=200))
    base = time.mktime((2026, 12, 3, 6, 17, 13, 0, 0, -1))
    view(StateChanged(t=base, state="hypothesis_after"))
    view(Sample(t=base, probe="slo", phase="after", verdict="ok", values={"v": 1}, duration_ms=2500.0))
    view(Sample(t=base, probe="health", phase="after", verdict="ok", values={"v": 2}, duration_ms=5.0))
    view(Recovered(t=base + 2.6, seconds=2.6))
    stamps = [line.split()[0] for line in buf.getvalue().splitlines()]
    assert stamps == sorted(stamps) and stamps[1:3] == ["06:17:15", "06:17:15"], buf.getvalue()
    assert "health [after] ok after 5 ms" in buf.getvalue()
