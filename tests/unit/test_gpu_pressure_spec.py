"""gpu.memory_pressure's spec: one amount, cross-field rules, device syntax, and what it hands the holder."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from chaoskit.gpu.hold import Target
from chaoskit.injectors.gpu.memory_pressure import GpuMemoryPressure, GpuMemoryPressureSpec


def spec(**kw) -> GpuMemoryPressureSpec:
    return GpuMemoryPressureSpec.model_validate({"type": "gpu.memory_pressure", **kw})


@pytest.mark.parametrize("kw, target", [
    ({"bytes": "20GiB"}, Target("bytes", 20 * 2**30, "fixed", 0.0)),
    ({"percent": "80%", "hold": "steady"}, Target("percent", 0.8, "steady", 0.0)),
    ({"leave_free": "2GiB", "ramp": "10s"}, Target("leave_free", 2 * 2**30, "fixed", 10.0)),
])
def test_target_handed_to_the_holder(kw, target):
    assert spec(**kw).target() == target


@pytest.mark.parametrize("kw, message", [
    ({}, "give exactly one of bytes, percent, leave_free or fragment"),
    ({"bytes": "1GiB", "percent": "5%"}, r"exactly one .* \(got bytes, percent\)"),
    ({"fragment": {"holes": 4, "hole_size": "256MiB"}, "hold": "steady"}, "fragment cannot be combined with hold"),
    ({"fragment": {"holes": 4, "hole_size": "256MiB"}, "ramp": "2s"}, "fragment cannot be combined with ramp"),
    ({"fragment": {"holes": 0, "hole_size": "256MiB"}}, "greater than 0"),
    ({"bytes": "40%"}, "given as 'percent:'"),
    ({"bytes": 0}, "must be greater than 0"),
    ({"percent": "0%"}, "percent must be greater than 0%"),
    ({"percent": "120%"}, "between 0% and 100%"),
    ({"bytes": "1GiB", "device": "gpu0"}, r"expected a GPU index, GPU-/MIG- UUID \(got"),
    ({"bytes": "1GiB", "device": -1}, "device index must be >= 0"),
    ({"bytes": "1GiB", "hold": "wobbly"}, "'fixed' or 'steady'"),
    ({"bytes": "1GiB", "size": "1GiB"}, "Extra inputs are not permitted"),
])
def test_invalid_specs(kw, message):
    with pytest.raises(ValidationError, match=message):
        spec(**kw)


def test_device_forms():
    assert spec(bytes="1GiB", device="1").device == 1
    mig = "MIG-4b7a8e2c-3f1d-5c9a-8e6b-0d1e2f3a4b5c"
    assert spec(bytes="1GiB", device=mig).device == mig


def test_plan_without_a_driver_names_the_target_and_why_facts_are_unknown():
    inj = GpuMemoryPressure(spec(percent="75%", hold="steady", ramp="2s"))
    inj.unknown = "no libcuda: libcuda.so.1: cannot open shared object file"
    lines = inj.plan()
    assert lines[0].startswith("start a CUDA holder process on device 0 (facts unknown: no libcuda")
    assert "keep the device's used memory at 75.0% of total, re-measured every 100 ms" in lines[0]
    assert "ramping up over 2s" in lines[0] and lines[1].startswith("revert: SIGTERM the holder")
