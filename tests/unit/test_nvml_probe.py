"""The nvml probe and chaoskit.gpu.nvml: against this host's real (absent) NVML, and a simulated NVML (test double)."""

from __future__ import annotations

import asyncio

import pytest

from chaoskit.errors import PreflightError
from chaoskit.gpu import nvml
from chaoskit.probes.nvml import NvmlProbe, NvmlProbeSpec
from tests.helpers.nvml_double import SimulatedNvml


def _nvml_missing() -> str | None:
    try:
        nvml.devices()
    except PreflightError as e:
        return str(e)
    return None


@pytest.fixture
def sim(monkeypatch: pytest.MonkeyPatch) -> SimulatedNvml:
    double = SimulatedNvml()
    monkeypatch.setattr(nvml, "module", lambda: double)
    return double


def probe(**kw) -> NvmlProbe:
    return NvmlProbe(NvmlProbeSpec.model_validate({"type": "nvml", "name": "gpu", **kw}))


@pytest.mark.skipif(_nvml_missing() is None, reason="this host has NVML")
def test_without_nvml_preflight_says_so():
    with pytest.raises(PreflightError, match=r"^nvml: no NVML: "):
        probe().preflight()


def test_measures_memory_health_processes(sim):
    sim.processes = {4242: 2 << 30}
    p = probe()
    p.preflight()
    v = asyncio.run(p.measure())
    assert v["memory_total"] == sim.total and v["memory_used"] == 1 << 30
    assert v["memory_used_share"] == pytest.approx((1 << 30) / sim.total)
    assert v["utilization_gpu"] == 37 and v["temperature_c"] == 41 and v["power_w"] == pytest.approx(123.456)
    assert v["ecc_corrected"] == 3 and v["ecc_uncorrected"] == 0
    assert v["mig_enabled"] is False and v["mig_devices"] == 0
    assert v["processes"] == 1 and v["process_memory"] == {"4242": 2 << 30}
    asyncio.run(p.close())
    assert sim.initialised == 0 and "eventSetFree" in sim.calls


def test_xid_events_are_counted_per_window(sim):
    p = probe()
    p.preflight()
    assert "registerEvents(8)" in sim.calls
    sim.xids += [79, 48]
    v = asyncio.run(p.measure())
    assert (v["xid_events"], v["last_xid"]) == (2, 48)
    v = asyncio.run(p.measure())
    assert (v["xid_events"], v["last_xid"]) == (0, None)
    asyncio.run(p.close())


def test_mig_enabled_counts_mig_devices(sim):
    sim.mig = (1, 1)
    p = probe()
    p.preflight()
    v = asyncio.run(p.measure())
    assert v["mig_enabled"] is True and v["mig_devices"] == 2
    asyncio.run(p.close())


def test_device_by_uuid_and_unknown_device(sim):
    p = probe(device="GPU-11111111-2222-3333-4444-555555555555")
    p.preflight()
    assert "byUUID(GPU-11111111-2222-3333-4444-555555555555)" in sim.calls
    asyncio.run(p.close())
    with pytest.raises(PreflightError, match=r"^nvml: no device 3 \(1 GPU\(s\) visible"):
        probe(device=3).preflight()
    assert sim.initialised == 0  # a failed preflight shuts NVML down again


def test_spec_validation():
    probe(expect={"memory_used_share": "< 0.8", "process_memory": {"4242": "< 1000"}})
    with pytest.raises(ValueError, match="unknown key 'memory'"):
        probe(expect={"memory": "< 1"})
    with pytest.raises(ValueError, match="expected a GPU index"):
        probe(device="gpu0")


def test_doctor_lists_devices_and_mig(sim):
    from chaoskit.doctor import _nvml

    c = _nvml()
    assert c.ok and c.detail == ("0: NVIDIA H200 (simulated) GPU-11111111-2222-3333-4444-555555555555 133.9GiB "
                                 "00000000:3B:00.0 MIG capable, disabled")
    sim.mig = None
    assert _nvml().detail.endswith("not MIG-capable")


def test_memory_pressure_reports_nvml_view(sim, tmp_path):
    from chaoskit.injectors.gpu.memory_pressure import GpuMemoryPressure

    token = "chaoskit-gpuholder-0123456789abcdef0123456789abcdef"  # no such holder runs
    record = {"token": token, "device": 0, "target": {"kind": "bytes", "value": 1 << 30},
              "status": str(tmp_path / f"{token}.status.json"), "journal": str(tmp_path / f"{token}.corrections.jsonl")}
    seen = GpuMemoryPressure.observe_details(GpuMemoryPressure.from_ledger(record))
    assert seen["nvml"] == {"total": sim.total, "used": 1 << 30, "free": sim.total - (1 << 30)}
    assert seen["in_effect"] is False and seen["holder"] is None and seen["corrections_total"] == 0
