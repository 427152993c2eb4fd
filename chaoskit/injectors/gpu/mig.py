"""gpu.mig: reconfigure a GPU's MIG layout (mig-parted's `mig-devices` form); revert restores the checkpoint exactly."""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field, field_validator

from chaoskit.errors import PreflightError
from chaoskit.gpu import mig, nvml
from chaoskit.gpu.mig import MigBackend, MigError, MigPlanError, format_layout, layout_of, normalize_target
from chaoskit.injectors.base import Injector, RevertRecord
from chaoskit.model.types import StrictModel
from chaoskit.targets.local import GpuTarget
from chaoskit.units import format_size

PREFIX = "gpu.mig: "
REVERT_LINE = ("revert: restore the checkpoint (MIG mode, GPU and compute instances at their exact placements), "
               "then assert the whole state equals it")


class MigSpec(StrictModel):
    type: Literal["gpu.mig"]
    device: int | str = Field(0, description="GPU index, UUID (GPU-...) or PCI bus id")
    mig_devices: dict[str, int] = Field(alias="mig-devices", description=(
        "target layout in mig-parted's form: profile -> count, e.g. {'1g.18gb': 7} or {'1c.3g.71gb': 3}; "
        "{} removes every MIG device"))
    enable_mig: bool = Field(False, description="turn MIG mode on if it is off (refused where that needs a reset)")
    force: bool = Field(False, description="reconfigure even while compute processes run on the GPU")

    @field_validator("device")
    @classmethod
    def _device(cls, v: int | str) -> int | str:
        return nvml.parse_device(v)

    @field_validator("mig_devices")
    @classmethod
    def _layout(cls, v: dict[str, int]) -> dict[str, int]:
        for name, count in v.items():
            mig.parse_profile(name)
            if count < 0:
                raise ValueError(f"{name}: count must be >= 0, got {count}")
        return v


def _one_line(e: Exception) -> str:
    text = " ".join(str(e).split()) or type(e).__name__
    return text if text.startswith(PREFIX) else PREFIX + text


def _process_list(procs: list[mig.ComputeProcess]) -> str:
    return ", ".join(f"pid {p.pid} ({p.name}" + (f", {format_size(p.used_memory)})" if p.used_memory else ")")
                     for p in procs)


class MigRecord(RevertRecord):
    """gpu.mig's record: the device and the MIG state checkpointed before the change (in the ledger as
    chaoskit.gpu.mig.to_json writes it), which revert restores; no checkpoint: prepare never read the state, so
    nothing was changed."""

    uuid: str | None = None
    checkpoint: mig.MigState | None = None
    device: int | str | None = None
    target: dict[str, int] = Field(default_factory=dict)  # the layout apply sets (mig-parted's form)
    enable_mig: bool = False
    applied: mig.MigState | None = None  # after apply: the state it left
    changed: bool | None = None
    note: str = ""


class MigReconfigure(Injector[MigSpec, MigRecord]):
    type: ClassVar[str] = "gpu.mig"
    host_needs: ClassVar[frozenset[str]] = frozenset({"nvml"})
    summary: ClassVar[str] = "reconfigure MIG instances (mig-parted layout); revert restores the checkpointed state"
    Spec = MigSpec
    spec: MigSpec
    Record = MigRecord

    @classmethod
    def backend(cls) -> MigBackend:
        from chaoskit.gpu.mig_nvml import NvmlMigBackend

        return NvmlMigBackend()

    def _target(self) -> dict[str, int]:
        return normalize_target(self.spec.mig_devices)

    def resolve_target(self) -> GpuTarget:
        try:
            facts = self.backend().describe(self.spec.device)
        except (PreflightError, MigError) as e:
            raise PreflightError(_one_line(e)) from None
        return GpuTarget(self.spec.device, facts.uuid, facts.name)

    def preflight(self) -> None:
        try:
            self._check(self.backend())
        except (PreflightError, MigError) as e:
            raise PreflightError(_one_line(e)) from None

    def _check(self, b: MigBackend) -> None:
        dev = self.spec.device
        facts = b.describe(dev)
        where = f"GPU {dev} ({facts.name})"
        if not facts.mig_capable:
            raise PreflightError(f"{where} is not MIG-capable")
        state = b.read_state(dev)
        if not state.mode_current and not self.spec.enable_mig:
            raise PreflightError(f"MIG mode is off on {where}; set enable_mig: true to turn it on")
        if not state.mode_current and facts.mode_change_needs_reset:
            raise PreflightError(f"enabling MIG on {where} needs a GPU reset (Ampere), which chaoskit does not do; "
                                 "enable MIG and reset the GPU beforehand (nvidia-smi -i N -mig 1; nvidia-smi -r -i N)")
        procs = [] if self.spec.force else b.compute_processes(dev)
        if procs:
            raise PreflightError(f"{where} has {len(procs)} running compute process(es): {_process_list(procs)}; "
                                 "stop them or set force: true")
        if state.mode_current:
            mig.plan_layout(state, self._target(), b.profiles(dev))  # unknown profile / does not fit -> refused

    def plan(self) -> list[str]:
        want = self._target()
        head = f"target MIG layout of GPU {self.spec.device}: {format_layout(want)}"
        try:
            return [head, *self._plan_lines(self.backend(), want), REVERT_LINE]
        except Exception as e:  # the runner prints plan lines in --dry-run: never raise from here
            return [head, f"current state unknown: {_one_line(e).removeprefix(PREFIX)}", REVERT_LINE]

    def _plan_lines(self, b: MigBackend, want: dict[str, int]) -> list[str]:
        dev = self.spec.device
        facts = b.describe(dev)
        state = b.read_state(dev)
        mode = "on" if state.mode_current else "off" + (" (pending on)" if state.mode_pending else "")
        lines = [f"GPU {dev}: {facts.name} {facts.uuid}, MIG mode {mode}, current layout "
                 f"{format_layout(layout_of(state))}"]
        if not facts.mig_capable:
            return [*lines, "refused: this GPU is not MIG-capable"]
        if not state.mode_current:
            lines += self._enable_lines(facts)
        try:
            profiles = b.profiles(dev)
        except Exception as e:
            return [*lines, f"then create {format_layout(want)} (placements are chosen once MIG mode is on: "
                            f"{_one_line(e).removeprefix(PREFIX)})"]
        try:
            ops = mig.plan_layout(state, want, profiles)
        except MigPlanError as e:
            return [*lines, f"refused: {e}"]
        steps = [op.describe() for op in ops if op.action != "enable_mig"]
        return lines + (steps or ["already matches: no change"])

    def _enable_lines(self, facts: mig.DeviceFacts) -> list[str]:
        refused = [] if self.spec.enable_mig else ["refused: MIG mode is off (set enable_mig: true to turn it on)"]
        if facts.mode_change_needs_reset:
            note = ("enable MIG mode: a GPU reset may be needed for it to take effect (Ampere needs one; "
                    "chaoskit does not reset GPUs, so preflight refuses)")
        else:
            note = "enable MIG mode: takes effect without a GPU reset on this GPU (Hopper or later)"
        return [*refused, note]

    def prepare(self) -> MigRecord:
        state = self.backend().read_state(self.spec.device)
        return MigRecord(device=self.spec.device, uuid=state.uuid, checkpoint=state,
                         target=self._target(), enable_mig=self.spec.enable_mig)

    def apply(self, record: MigRecord) -> MigRecord:
        before = record.checkpoint
        assert before is not None  # prepare read it
        now = mig.apply_layout(self.backend(), record.uuid, record.target, enable_mig=record.enable_mig)
        changed = not mig.same_state(before, now)
        note = "changed" if changed else "already matches: no change"
        return record.model_copy(update={"applied": now, "changed": changed, "note": note})

    @classmethod
    def revert(cls, record: MigRecord) -> None:
        r = record
        if r.checkpoint is None:
            return  # prepare never read the state: nothing was changed
        checkpoint = r.checkpoint
        b = cls.backend()
        mig.restore(b, checkpoint.uuid, checkpoint)
        mig.assert_equal(checkpoint, b.read_state(checkpoint.uuid))

    @classmethod
    def observe(cls, record: MigRecord) -> bool:
        r = record
        if r.checkpoint is None:
            return False
        checkpoint = r.checkpoint
        return not mig.same_state(checkpoint, cls.backend().read_state(checkpoint.uuid))
