"""What load.duration means for a continuous slo probe's open-ended schedule: a ramp takes it, then holds."""

from __future__ import annotations

import math
from itertools import takewhile

from chaoskit.load.schedule import schedule
from chaoskit.load.spec import LoadSpec


def _ramp() -> LoadSpec:
    return LoadSpec(url="http://127.0.0.1:1/", rate=10, duration="2s", arrival="ramp", ramp_to=50)


def test_an_open_ended_ramp_reaches_ramp_to_after_duration_then_holds():
    sends = list(takewhile(lambda t: t < 4, schedule(_ramp(), math.inf)))
    first, then = [t for t in sends if t < 2], [t for t in sends if 2 <= t < 4]
    assert len(first) == len(list(schedule(_ramp(), 2))) == 59  # the same ramp as a bounded run of 2 s
    assert len(then) == 100  # 50/s from there on (it used to stay at 10/s: the ramp divided by an infinite span)


def test_other_arrivals_are_unchanged_by_an_open_end():
    spec = LoadSpec(url="http://127.0.0.1:1/", rate=20, duration="1s", arrival="poisson", seed=3)
    assert list(takewhile(lambda t: t < 1, schedule(spec, math.inf))) == list(schedule(spec, 1))
