"""host.memory_pressure's spec: exactly one of size / leave_available / target_used, bad values, and what preflight,
plan and prepare make of each mode on a host with known /proc/meminfo numbers."""

from __future__ import annotations

import json

import pytest
from pydantic import ValidationError

from chaoskit.errors import PreflightError
from chaoskit.experiment.schema import experiment_schema
from chaoskit.injectors.memory import pressure as memory
from chaoskit.injectors.memory.pressure import MemoryPressure, MemoryPressureSpec

GiB, MiB = 1 << 30, 1 << 20


def spec(**kw) -> MemoryPressureSpec:
    return MemoryPressureSpec.model_validate({"type": "host.memory_pressure", **kw})


@pytest.fixture
def host(monkeypatch: pytest.MonkeyPatch):
    """A 16 GiB host with `avail` bytes available (settable)."""
    state = {"MemTotal": 16 * GiB, "MemAvailable": 12 * GiB}
    monkeypatch.setattr(memory, "meminfo", lambda: (state["MemTotal"], state["MemAvailable"]))
    return state


@pytest.mark.parametrize("kw", [
    {"size": "512MiB"}, {"size": "40%"}, {"size": 1 << 20}, {"size": "2GiB", "allow_unsafe": True},
    {"leave_available": "1GiB"}, {"leave_available": "10%"}, {"leave_available": 1 << 30},
    {"target_used": "75%"}, {"target_used": 75}, {"target_used": "12.3456%"},
])
def test_valid_modes(kw):
    s = spec(**kw)
    assert s.holds == ("size" not in kw)


@pytest.mark.parametrize("kw, message", [
    ({}, r"give exactly one of size .*, leave_available .* or target_used"),
    ({"size": "1GiB", "target_used": "75%"}, r"exactly one .* \(got size, target_used\)"),
    ({"leave_available": "1GiB", "target_used": "75%"}, r"\(got leave_available, target_used\)"),
    ({"size": "1GiB", "leave_available": "1GiB", "target_used": "5%"}, r"\(got size, leave_available, target_used\)"),
    ({"size": "-1GiB"}, "a size cannot be negative"),
    ({"size": 0}, "size must be greater than 0"),
    ({"size": "lots"}, "expected a size like"),
    ({"leave_available": "0MiB"}, "must be greater than 0"),
    ({"leave_available": "-1GiB"}, "a size cannot be negative"),
    ({"leave_available": "a bit"}, "expected a size like"),
    ({"target_used": "0%"}, "target_used must be between 0% and 100%, both excluded"),
    ({"target_used": "100%"}, "both excluded"),
    ({"target_used": "150%"}, "between 0% and 100%"),
    ({"target_used": "-5%"}, "cannot be negative"),
    ({"target_used": "3GiB"}, "expected a percentage like"),
    ({"size": "1GiB", "sise": 2}, "Extra inputs are not permitted"),
])
def test_invalid_specs(kw, message):
    with pytest.raises(ValidationError, match=message):
        spec(**kw)


def test_schema_lists_the_modes():
    props = experiment_schema()["$defs"]["MemoryPressureSpec"]["properties"]
    assert {"size", "leave_available", "target_used", "allow_unsafe"} <= set(props)


def test_fixed_size_preflight_is_unchanged(host):
    MemoryPressure(spec(size="9GiB")).preflight()  # 9 <= 0.8 * 12
    with pytest.raises(PreflightError, match=r"10.0GiB is more than 80% of the 12.0GiB available now; set "
                                             r"allow_unsafe: true to force"):
        MemoryPressure(spec(size="10GiB")).preflight()
    MemoryPressure(spec(size="10GiB", allow_unsafe=True)).preflight()


def test_hold_preflight_refuses_what_it_cannot_do(host):
    # used = 4 GiB = 25%: a target below it leaves nothing to hold
    with pytest.raises(PreflightError, match=r"nothing to hold: used memory is already 4.0GiB \(25.0% of "
                                             r"MemTotal, 12.0GiB available\), at or past the goal \(used memory "
                                             r"at 20.00% of MemTotal"):
        MemoryPressure(spec(target_used="20%")).preflight()
    with pytest.raises(PreflightError, match="nothing to hold"):
        MemoryPressure(spec(leave_available="12GiB")).preflight()
    # 90% used -> hold 10.4 GiB, more than 80% of 12 GiB
    with pytest.raises(PreflightError, match=r"would need 10.4GiB now, more than its cap of 9.6GiB \(80% of the "
                                             r"12.0GiB available now\); set allow_unsafe: true"):
        MemoryPressure(spec(target_used="90%")).preflight()
    MemoryPressure(spec(target_used="90%", allow_unsafe=True)).preflight()
    # the floor is max(5% of 16 GiB, 256 MiB) = 819 MiB, and allow_unsafe does not lift it
    with pytest.raises(PreflightError, match=r"below the floor: a hold never pushes available memory under 819.2MiB"):
        MemoryPressure(spec(leave_available="512MiB", allow_unsafe=True)).preflight()
    with pytest.raises(PreflightError, match="below the floor"):
        MemoryPressure(spec(target_used="96%", allow_unsafe=True)).preflight()
    MemoryPressure(spec(target_used="75%")).preflight()
    MemoryPressure(spec(leave_available="4GiB")).preflight()


def test_prepare_hands_the_holder_its_goal_cap_floor_and_deadband(host, tmp_path, monkeypatch):
    monkeypatch.setenv("CHAOSKIT_STATE_DIR", str(tmp_path))
    rec = MemoryPressure(spec(target_used="75%")).prepare()
    assert rec.token.startswith("chaoskit-holder-") and rec.status.startswith(str(tmp_path / "memory"))
    assert rec.goal_available == 4 * GiB and rec.bytes == int(0.8 * 12 * GiB)  # bytes = the cap
    assert rec.floor == int(0.05 * 16 * GiB) and rec.deadband == int(0.0025 * 16 * GiB)
    assert json.loads(rec.config()) == {"status": rec.status, "goal_available": rec.goal_available,
                                        "floor": rec.floor, "deadband": rec.deadband}
    assert MemoryPressure(spec(leave_available="10%")).prepare().goal_available == int(1.6 * GiB)
    assert MemoryPressure(spec(target_used="75%", allow_unsafe=True)).prepare().bytes == 16 * GiB
    fixed = MemoryPressure(spec(size="1GiB")).prepare()
    assert fixed.bytes == GiB and json.loads(fixed.config()) == {"status": fixed.status}  # no goal: a fixed size


def test_plan_words_the_behaviour(host):
    fixed = MemoryPressure(spec(size="1GiB")).plan()
    assert "maps 1.0GiB of anonymous memory" in fixed[0] and "MADV_POPULATE_WRITE" in fixed[0]
    assert fixed[-1].startswith("revert: SIGTERM the holder")
    hold = " ".join(MemoryPressure(spec(target_used="75%")).plan())
    assert "keeps used memory at 75.00% of MemTotal 16.0GiB (available memory 4.0GiB)" in hold
    assert "holding about 8.0GiB" in hold and "every 100 ms it re-reads available memory" in hold
    assert "never holds more than 9.6GiB (80% of the 12.0GiB available now)" in hold
    assert "never pushes available memory below 819.2MiB" in hold
    assert "available memory at 2.0GiB" in " ".join(MemoryPressure(spec(leave_available="2GiB")).plan())
