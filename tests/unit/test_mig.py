"""gpu.mig: layout plans, apply that never reports success without change, checkpoint restore with a full-state
assertion, refusals, spec validation, the ledger JSON round-trip — against SimulatedMigGpu (an in-test double)
and, for the no-NVML path, the real NVML backend on this GPU-less host."""

from __future__ import annotations

import json

import pytest
from pydantic import ValidationError

from chaoskit.errors import PreflightError
from chaoskit.gpu import mig
from chaoskit.gpu.mig import ComputeProcess, MigError, MigMismatch, MigPlanError, Placement
from chaoskit.injectors import injector_class
from chaoskit.injectors.gpu.mig import MigReconfigure, MigSpec
from tests.helpers.mig_double import SimulatedMigGpu

UUID = "GPU-5171e0a7-0000-4000-8000-00000000c0de"


def spec(**kw) -> MigSpec:
    return MigSpec.model_validate({"type": "gpu.mig", "mig-devices": {"1g.18gb": 7}, **kw})


@pytest.fixture
def use(monkeypatch: pytest.MonkeyPatch):
    """Point MigReconfigure.backend() at a double; returns (injector, gpu)."""

    def make(gpu: SimulatedMigGpu, **kw) -> MigReconfigure:
        monkeypatch.setattr(MigReconfigure, "backend", classmethod(lambda cls: gpu))
        return MigReconfigure(spec(**kw))

    return make


def mixed(gpu: SimulatedMigGpu) -> SimulatedMigGpu:
    """H200 with 2g.35gb@0 (one CI), 1g.18gb@2 (one CI) and 3g.71gb@4 holding three 1c CIs."""
    p = {prof.name: prof for prof in gpu.profiles(0).values()}
    a = gpu.create_gi(0, p["2g.35gb"].profile_id, Placement(0, 2))
    gpu.create_ci(0, a, 2, None)
    b = gpu.create_gi(0, p["1g.18gb"].profile_id, Placement(2, 1))
    gpu.create_ci(0, b, 1, None)
    c = gpu.create_gi(0, p["3g.71gb"].profile_id, Placement(4, 4))
    for s in range(3):
        gpu.create_ci(0, c, 1, Placement(s, 1))
    gpu.calls.clear()
    return gpu


# ---------------------------------------------------------------- plans


def test_plan_empty_to_seven_1g_on_h200_lists_seven_creates_with_placements():
    gpu = SimulatedMigGpu("H200")
    ops = mig.plan_layout(gpu.read_state(0), {"1g.18gb": 7}, gpu.profiles(0))
    gis = [op for op in ops if op.action == "create_gi"]
    cis = [op for op in ops if op.action == "create_ci"]
    assert len(ops) == 14 and len(gis) == 7 and len(cis) == 7
    assert [op.placement for op in gis] == [Placement(s, 1) for s in range(7)]
    assert {op.profile_id for op in gis} == {19}
    assert [op.gi_start for op in cis] == list(range(7))
    assert ops[0].describe() == "create GPU instance 1g.18gb (profile id 19) at placement start=0 size=1"


def test_plan_keeps_matching_instances_and_destroys_the_rest():
    gpu = mixed(SimulatedMigGpu("H200"))
    ops = mig.plan_layout(gpu.read_state(0), {"1g.18gb": 7}, gpu.profiles(0))
    destroyed = {op.gi_id for op in ops if op.action == "destroy_gi"}
    kept = next(g for g in gpu.read_state(0).gpu_instances if g.placement == Placement(2, 1))
    assert kept.id not in destroyed and len(destroyed) == 2
    assert [op.placement.start for op in ops if op.action == "create_gi"] == [0, 1, 3, 4, 5, 6]
    assert [op.action for op in ops[:5]] == ["destroy_ci", "destroy_gi", "destroy_ci", "destroy_ci", "destroy_ci"]


def test_plan_of_the_current_layout_is_empty():
    gpu = SimulatedMigGpu("H200")
    mig.apply_layout(gpu, 0, {"1g.18gb": 7})
    assert mig.plan_layout(gpu.read_state(0), {"1g.18gb": 7, "7g.141gb": 0}, gpu.profiles(0)) == []


def test_layout_that_fits_only_with_the_right_placements_is_found():
    gpu = SimulatedMigGpu("H100")
    ops = mig.plan_layout(gpu.read_state(0), {"1g.10gb": 2, "2g.20gb": 1, "3g.40gb": 1}, gpu.profiles(0))
    where = {op.profile: op.placement for op in ops if op.action == "create_gi"}
    assert where["3g.40gb"] == Placement(4, 4) and where["2g.20gb"] == Placement(0, 2)
    state = mig.apply_layout(gpu, 0, {"1g.10gb": 2, "2g.20gb": 1, "3g.40gb": 1})
    assert mig.layout_of(state) == {"1g.10gb": 2, "2g.20gb": 1, "3g.40gb": 1}


@pytest.mark.parametrize("target", [{"1g.18gb": 8}, {"3g.71gb": 2, "1g.18gb": 2}, {"1g.35gb": 4, "1g.18gb": 1},
                                    {"7g.141gb": 1, "1g.18gb": 1}])
def test_layout_that_does_not_fit_is_refused_clearly(target):
    gpu = SimulatedMigGpu("H200")
    with pytest.raises(MigPlanError, match="does not fit on this GPU"):
        mig.plan_layout(gpu.read_state(0), target, gpu.profiles(0))
    assert gpu.calls == []


def test_profile_of_another_gpu_is_refused_with_the_ones_it_has():
    gpu = SimulatedMigGpu("H200")
    with pytest.raises(MigPlanError, match=r"no 1g\.10gb profile .*1g\.18gb"):
        mig.plan_layout(gpu.read_state(0), {"1g.10gb": 1}, gpu.profiles(0))


def test_compute_instance_combos_pack_into_gpu_instances_like_mig_parted():
    gpu = SimulatedMigGpu("H200")
    state = mig.apply_layout(gpu, 0, {"1c.3g.71gb": 4})
    assert mig.layout_of(state) == {"1c.3g.71gb": 4}
    assert sorted(len(g.compute_instances) for g in state.gpu_instances) == [1, 3]
    assert mig.normalize_target({"3c.3g.71gb": 1, "2g.35gb": 0}) == {"3g.71gb": 1}


def test_repartition_that_cannot_keep_instances_recreates_everything():
    gpu = SimulatedMigGpu("H200")
    mig.apply_layout(gpu, 0, {"1g.18gb": 7})
    state = mig.apply_layout(gpu, 0, {"1g.18gb": 5, "2g.35gb": 1})
    assert mig.layout_of(state) == {"1g.18gb": 5, "2g.35gb": 1}


# ---------------------------------------------------------------- never success without change


def test_apply_of_a_matching_layout_makes_no_calls_and_says_so(use):
    gpu = SimulatedMigGpu("H200")
    mig.apply_layout(gpu, 0, {"1g.18gb": 7})
    gpu.calls.clear()
    inj = use(gpu)
    assert "already matches: no change" in inj.plan()
    record = inj.apply(inj.prepare())
    assert record.changed is False and record.note == "already matches: no change"
    assert gpu.calls == []


@pytest.mark.parametrize("operation", ["create_ci", "create_gi"])
def test_a_create_that_silently_does_nothing_makes_apply_raise(use, operation):
    gpu = SimulatedMigGpu("H200")
    gpu.drop_next(operation)
    inj = use(gpu)
    record = inj.prepare()
    with pytest.raises(MigError) as e:
        inj.apply(record)
    if operation == "create_ci":
        assert "the layout is 6x 1g.18gb, not the target 7x 1g.18gb" in str(e.value)
    else:
        assert "create compute instance 1g.18gb" in str(e.value) and "NOT_FOUND" in str(e.value)
    MigReconfigure.revert(record)  # and the partial change is undone
    assert record.checkpoint is not None and mig.same_state(gpu.read_state(0), record.checkpoint)


def test_a_mode_change_that_silently_does_nothing_makes_apply_raise():
    gpu = SimulatedMigGpu("H200", mode=False)
    gpu.drop_next("set_mode")
    with pytest.raises(MigError, match="the mode did not change"):
        mig.apply_layout(gpu, 0, {"1g.18gb": 1}, enable_mig=True)


# ---------------------------------------------------------------- checkpoint, apply, revert


def test_checkpoint_apply_revert_restores_exact_placements(use):
    gpu = mixed(SimulatedMigGpu("H200"))
    before = gpu.read_state(0)
    inj = use(gpu)
    record = MigReconfigure.read_record(json.loads(json.dumps(inj.prepare().to_json())))  # as the ledger has it
    assert record.checkpoint == before
    record = MigReconfigure.read_record(json.loads(json.dumps(inj.apply(record).to_json())))
    assert mig.layout_of(gpu.read_state(0)) == {"1g.18gb": 7} and record.changed is True
    assert MigReconfigure.observe(record) is True

    MigReconfigure.revert(record)
    after = gpu.read_state(0)
    assert mig.same_state(before, after)
    assert [(g.profile, g.placement, [c.placement for c in g.compute_instances]) for g in after.gpu_instances] == [
        ("2g.35gb", Placement(0, 2), [Placement(0, 2)]),
        ("1g.18gb", Placement(2, 1), [Placement(0, 1)]),
        ("3g.71gb", Placement(4, 4), [Placement(0, 1), Placement(1, 1), Placement(2, 1)]),
    ]
    assert {g.id for g in after.gpu_instances} != {g.id for g in before.gpu_instances}  # ids are new, not compared
    assert MigReconfigure.observe(record) is False
    gpu.calls.clear()
    MigReconfigure.revert(record)  # idempotent: already equal -> success without a call
    assert gpu.calls == []


def test_a_tampered_restore_makes_revert_raise_naming_the_difference(use):
    gpu = mixed(SimulatedMigGpu("H200"))
    inj = use(gpu)
    record = inj.apply(inj.prepare())
    gpu.drop_next("create_ci")  # the first CI the restore creates: the 2g.35gb GI's (1g.18gb@2 is kept)
    with pytest.raises(MigMismatch) as e:
        MigReconfigure.revert(record)
    assert e.value.differences == [
        "GPU instance 2g.35gb at start=0 size=2: compute instance 2g.35gb (profile id 1) at start=0 size=2 is in "
        "the checkpoint, missing now"]
    assert MigReconfigure.observe(record) is True
    MigReconfigure.revert(record)  # a second revert repairs it
    assert MigReconfigure.observe(record) is False


def test_differences_name_mode_and_instances():
    gpu = mixed(SimulatedMigGpu("H200"))
    cp = gpu.read_state(0)
    off = mig.MigState(cp.uuid, False, False)
    diff = mig.differences(cp, off)
    assert diff[0] == "MIG mode: checkpoint current=enabled pending=enabled, now current=disabled pending=disabled"
    assert "GPU instance 3g.71gb at start=4 size=4 is in the checkpoint, missing now" in diff
    with pytest.raises(MigMismatch, match="MIG mode: checkpoint"):
        mig.assert_equal(cp, off)


def test_enable_mig_on_hopper_then_revert_turns_it_off_again(use):
    gpu = SimulatedMigGpu("H200", mode=False)
    inj = use(gpu, enable_mig=True)
    inj.preflight()
    plan = inj.plan()
    assert any("without a GPU reset" in line for line in plan)
    assert not any("reset may be needed" in line for line in plan)
    record = inj.apply(inj.prepare())
    assert gpu.mode_current and mig.layout_of(gpu.read_state(0)) == {"1g.18gb": 7}
    MigReconfigure.revert(record)
    assert not gpu.mode_current and not gpu.mode_pending and gpu.gis == {}


def test_ampere_like_gpu_mode_change_stays_pending_and_is_reported():
    gpu = SimulatedMigGpu("H100", mode=False, needs_reset=True)
    cp = gpu.read_state(0)
    with pytest.raises(MigError, match="pending enable: this GPU needs a GPU reset"):
        mig.apply_layout(gpu, 0, {"1g.10gb": 7}, enable_mig=True)
    assert gpu.mode_pending and not gpu.mode_current
    mig.restore(gpu, UUID, cp)  # a pending change is withdrawn without a reset
    mig.assert_equal(cp, gpu.read_state(0))


# ---------------------------------------------------------------- refusals (preflight)


def test_refuses_a_gpu_that_is_not_mig_capable(use):
    inj = use(SimulatedMigGpu("H200", mig_capable=False))
    with pytest.raises(PreflightError, match=r"^gpu\.mig: GPU 0 \(NVIDIA H200\) is not MIG-capable$"):
        inj.preflight()
    assert "refused: this GPU is not MIG-capable" in inj.plan()


def test_refuses_mig_mode_off_without_enable_mig(use):
    gpu = SimulatedMigGpu("H200", mode=False)
    inj = use(gpu)
    with pytest.raises(PreflightError, match=r"^gpu\.mig: MIG mode is off on GPU 0 .*set enable_mig: true"):
        inj.preflight()
    plan = inj.plan()
    assert any(line.startswith("refused: MIG mode is off") for line in plan)
    assert any("placements are chosen once MIG mode is on" in line for line in plan)
    assert gpu.calls == []


def test_mode_off_with_enable_mig_on_ampere_plan_says_reset_and_preflight_refuses(use):
    gpu = SimulatedMigGpu("H100", mode=False, needs_reset=True)
    inj = use(gpu, enable_mig=True, **{"mig-devices": {"1g.10gb": 7}})
    assert any("a GPU reset may be needed" in line and "Ampere" in line for line in inj.plan())
    with pytest.raises(PreflightError, match=r"^gpu\.mig: enabling MIG on GPU 0 .* needs a GPU reset"):
        inj.preflight()


def test_refuses_running_compute_processes_unless_forced(use):
    procs = [ComputeProcess(4242, "python3", 2 << 30), ComputeProcess(4343, "tritonserver", None)]
    gpu = SimulatedMigGpu("H200", processes=procs)
    with pytest.raises(PreflightError) as e:
        use(gpu).preflight()
    msg = str(e.value)
    assert msg.startswith("gpu.mig: GPU 0 (NVIDIA H200) has 2 running compute process(es): ")
    assert "pid 4242 (python3, 2.0GiB)" in msg and "pid 4343 (tritonserver)" in msg and "force: true" in msg
    assert "\n" not in msg
    use(gpu, force=True).preflight()


def test_preflight_refuses_a_layout_that_does_not_fit(use):
    inj = use(SimulatedMigGpu("H200"), **{"mig-devices": {"4g.71gb": 1, "3g.71gb": 2}})
    with pytest.raises(PreflightError, match=r"^gpu\.mig: layout 2x 3g\.71gb, 1x 4g\.71gb does not fit"):
        inj.preflight()
    assert any(line.startswith("refused: layout") for line in inj.plan())


def test_unknown_device_is_a_one_line_preflight_error(use):
    inj = use(SimulatedMigGpu("H200"), device=3)
    with pytest.raises(PreflightError, match=r"^gpu\.mig: no device 3 "):
        inj.preflight()
    assert inj.plan()[1].startswith("current state unknown: no device 3")


# ---------------------------------------------------------------- spec and record


def test_spec_accepts_mig_parted_form_and_index_or_uuid():
    s = MigSpec.model_validate({"type": "gpu.mig", "device": "1", "mig-devices": {"1c.3g.71gb": "3"}})
    assert s.device == 1 and s.mig_devices == {"1c.3g.71gb": 3}
    assert MigSpec.model_validate({"type": "gpu.mig", "device": UUID, "mig_devices": {}}).device == UUID
    assert injector_class("gpu.mig") is MigReconfigure


@pytest.mark.parametrize("data, needle", [
    ({"mig-devices": {"1g18gb": 7}}, "is not a MIG profile name"),
    ({"mig-devices": {"4c.3g.71gb": 1}}, "cannot be larger than its GPU instance"),
    ({"mig-devices": {"1g.18gb": -1}}, "count must be >= 0"),
    ({"mig-devices": {"1g.18gb": 7}, "enable": True}, "Extra inputs are not permitted"),
    ({"mig-device": {"1g.18gb": 7}}, "Field required"),
    ({"mig-devices": {"1g.18gb": 7}, "device": -1}, "device index must be >= 0"),
])
def test_spec_validation_errors(data, needle):
    with pytest.raises(ValidationError, match=needle):
        MigSpec.model_validate({"type": "gpu.mig", **data})


def test_state_json_round_trip_is_plain_data():
    gpu = mixed(SimulatedMigGpu("H200"))
    state = gpu.read_state(0)
    data = json.loads(json.dumps(mig.to_json(state)))
    assert mig.from_json(data) == state
    assert data["gpu_instances"][2]["compute_instances"][1]["placement"] == {"start": 1, "size": 1}


# ---------------------------------------------------------------- this host: no NVML


def _nvml_loads() -> bool:
    try:
        import pynvml

        pynvml.nvmlInit()
        pynvml.nvmlShutdown()
        return True
    except Exception:
        return False


@pytest.mark.skipif(_nvml_loads(), reason="NVML is present on this host; the no-NVML path needs a GPU-less host")
def test_without_nvml_preflight_fails_with_one_line_and_plan_still_describes_the_target():
    inj = MigReconfigure(spec())
    with pytest.raises(PreflightError) as e:
        inj.preflight()
    assert str(e.value).startswith("gpu.mig: no NVML") and "\n" not in str(e.value)
    plan = inj.plan()
    assert plan[0] == "target MIG layout of GPU 0: 7x 1g.18gb"
    assert plan[1].startswith("current state unknown: no NVML")
    assert plan[2].startswith("revert: restore the checkpoint")


def test_nvml_backend_names_profiles_like_mig_parted_when_nvml_gives_no_name():
    from types import SimpleNamespace

    from chaoskit.gpu.mig_nvml import _gi_profile_name

    h100 = 81_559 << 20
    assert _gi_profile_name(SimpleNamespace(name=b"MIG 1g.10gb", sliceCount=1, memorySizeMB=9_856), h100) == "1g.10gb"
    assert _gi_profile_name(SimpleNamespace(name=b"", sliceCount=1, memorySizeMB=9_856), h100) == "1g.10gb"
    assert _gi_profile_name(SimpleNamespace(name=b"", sliceCount=3, memorySizeMB=40_192), h100) == "3g.40gb"
