"""gpu.memory_pressure: a holder process takes GPU memory with real CUDA allocations; revert = it releases and exits."""

from __future__ import annotations

import json
import os
import subprocess
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from chaoskit.errors import PreflightError
from chaoskit.gpu import nvml
from chaoskit.gpu.cuda import visible_devices_env
from chaoskit.gpu.hold import Target
from chaoskit.injectors import helper_proc
from chaoskit.injectors.base import NODE_EXECUTORS, FaultContext, NodeHelper
from chaoskit.model.types import Duration, Percent, StrictModel
from chaoskit.paths import state_dir
from chaoskit.targets.kube import KubeNodeSelector
from chaoskit.targets.local import GpuTarget
from chaoskit.targets.process import ProcessRef
from chaoskit.units import format_size, is_percent, parse_size

PROBE_TIMEOUT_S = 60.0
CORRECTIONS_IN_REPORT = 2000


def _size(v: str | int) -> str | int:
    if is_percent(v):
        raise ValueError("a share of the device is given as 'percent:', not as a size")
    if parse_size(v) <= 0:
        raise ValueError("must be greater than 0")
    return v


class FragmentSpec(StrictModel):
    holes: int = Field(gt=0, le=4096, description="number of separate free holes to leave")
    hole_size: str | int = Field(description="size of each hole, e.g. 256MiB")

    @field_validator("hole_size")
    @classmethod
    def _hole(cls, v: str | int) -> str | int:
        return _size(v)


class GpuMemoryPressureSpec(StrictModel):
    type: Literal["gpu.memory_pressure"]
    device: int | str = Field(0, description="GPU index (nvidia-smi order), GPU-UUID or MIG-UUID; with "
                              "kubernetes: the index among the container's own GPUs, or one of their UUIDs")
    kubernetes: KubeNodeSelector | None = Field(None, description="the GPU of each chosen pod's container (a "
                                                "helper pod on its node takes the memory)")
    bytes_: str | int | None = Field(None, alias="bytes", description="bytes to take, e.g. 20GiB")
    percent: Percent | None = Field(None, description="share of the device's total memory, e.g. 80%")
    leave_free: str | int | None = Field(None, description="allocate until only this much is free, e.g. 2GiB")
    hold: Literal["fixed", "steady"] = Field("fixed", description="fixed: take the amount once; steady: keep "
                                             "the device's used level on target, correcting every 100 ms")
    ramp: Duration = Field(0.0, ge=0, description="reach the target gradually over this long")
    fragment: FragmentSpec | None = Field(None, description="leave free memory as N separated holes")

    @field_validator("device")
    @classmethod
    def _device(cls, v: int | str) -> int | str:
        return nvml.parse_device(v, pci=False)  # CUDA_VISIBLE_DEVICES takes an index or a UUID, not a bus id

    @field_validator("bytes_", "leave_free")
    @classmethod
    def _sizes(cls, v: str | int | None) -> str | int | None:
        return v if v is None else _size(v)

    @model_validator(mode="after")
    def _combos(self) -> GpuMemoryPressureSpec:
        amounts = [k for k, v in (("bytes", self.bytes_), ("percent", self.percent), ("leave_free", self.leave_free),
                                  ("fragment", self.fragment)) if v is not None]
        if len(amounts) != 1:
            raise ValueError("give exactly one of bytes, percent, leave_free or fragment"
                             + (f" (got {', '.join(amounts)})" if amounts else ""))
        rules = [
            (self.fragment is not None and self.hold == "steady", "fragment cannot be combined with hold: steady"),
            (self.fragment is not None and self.ramp > 0, "fragment cannot be combined with ramp"),
            (self.percent == 0, "percent must be greater than 0%"),
        ]
        for broken, why in rules:
            if broken:
                raise ValueError(why)
        return self

    def target(self) -> Target:
        """What the holder holds (chaoskit.gpu.hold's Target)."""
        if self.percent is not None:
            kind, value = "percent", float(self.percent)
        elif self.leave_free is not None:
            kind, value = "leave_free", float(parse_size(self.leave_free))
        else:
            kind, value = "bytes", float(parse_size(self.bytes_)) if self.bytes_ is not None else 0.0
        return Target(kind, value, self.hold, self.ramp)


def node_device(container_id: str, device: int | str) -> int | str:
    """The node's name for a pod's container's GPU `device` (its index among the GPUs the container was given, or
    one of their UUIDs): an index or a UUID, as a spec's `device` on the node."""
    from chaoskit.targets.container import container_gpus

    node_name = container_gpus(container_id).pick(device)
    if node_name.startswith("minor:"):
        node_name = nvml.uuid_of_minor(int(node_name.removeprefix("minor:")))
    return int(node_name) if node_name.isdigit() else node_name


HOLDER = "chaoskit.injectors.gpu.holder"  # the helper process: holds the memory (or probes the device)


@dataclass(frozen=True)
class DeviceFacts:
    """The device as a holder-to-be sees it: its name, UUID, total and free bytes."""

    name: str
    uuid: str
    total: int
    free: int


def probe_device(device: int | str) -> DeviceFacts:
    """The device's facts, read by a holder-to-be in a fresh process (same env)."""
    try:
        out = subprocess.run([*helper_proc.command(HOLDER), "probe"],
                             env=helper_proc.env(visible_devices_env(device)), capture_output=True, text=True,
                             timeout=PROBE_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise PreflightError(f"gpu.memory_pressure: device {device}: the CUDA driver did not answer within "
                             f"{PROBE_TIMEOUT_S:g}s") from None
    line = (out.stdout.strip().splitlines() or [out.stderr.strip()[-300:]])[-1]
    if out.returncode != 0:
        raise PreflightError(f"gpu.memory_pressure: device {device}: {line}")
    facts = json.loads(line)
    return DeviceFacts(facts["name"], facts["uuid"], int(facts["total"]), int(facts["free"]))


class Holes(BaseModel):
    """fragment: how many free holes the holder leaves, of how many bytes each."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    holes: int
    hole_size: int


class GpuHolderRecord(helper_proc.HelperFiles):
    """gpu.memory_pressure's record: the holder's token, status and corrections journal, the device and what it
    holds there; once started, the holder."""

    device: int | str
    target: Target
    fragment: Holes | None = None
    holder: ProcessRef | None = None

    def config(self) -> str:
        """What the holder is started with (JSON)."""
        return self.model_dump_json(include={"target", "fragment", "status", "journal"})

    def holder_file(self, path: str | None) -> Path | None:
        """The holder's status or journal file, through the holder's /proc root while it runs: in a Kubernetes
        helper pod the holder lives in the apply helper's pod, whose files an observe helper does not share."""
        if path is None:
            return None
        file, pid = Path(path), self.holder.pid if self.holder is not None else None
        through = Path(f"/proc/{pid}/root") / file.relative_to(file.anchor) if pid and file.is_absolute() else file
        return through if through.exists() else file


class GpuMemoryPressure(helper_proc.HelperFault[GpuMemoryPressureSpec, GpuHolderRecord]):
    executors: ClassVar[frozenset[str]] = NODE_EXECUTORS
    target_field: ClassVar[str | None] = "kubernetes"
    node_helper: ClassVar[NodeHelper] = NodeHelper(  # the container's GPUs: read from its init's environment and /dev
        capabilities=("SYS_PTRACE",), gpu=True)
    helper: ClassVar[str | None] = HOLDER
    Record = GpuHolderRecord
    type: ClassVar[str] = "gpu.memory_pressure"
    host_needs: ClassVar[frozenset[str]] = frozenset({"cuda", "nvml"})
    summary: ClassVar[str] = ("take GPU memory with real CUDA allocations: bytes/percent/leave_free, held "
                              "steady, ramped or fragmented (revert: the holder frees and exits)")
    Spec = GpuMemoryPressureSpec
    spec: GpuMemoryPressureSpec

    def __init__(self, spec: GpuMemoryPressureSpec, ctx: FaultContext | None = None):
        super().__init__(spec, ctx)
        self.facts: DeviceFacts | None = None
        self.unknown = "device not checked yet"

    @classmethod
    def on_node(cls, spec: GpuMemoryPressureSpec, container_id: str) -> GpuMemoryPressureSpec:
        """The spec on a pod's node: `device` becomes the node's name for the container's GPU."""
        return spec.model_copy(update={"kubernetes": None, "device": node_device(container_id, spec.device)})

    def resolve_target(self) -> GpuTarget:
        """The device as its CUDA driver names it (asked once: a device keeps its identity for the run)."""
        if self.facts is None:
            try:
                self.facts = probe_device(self.spec.device)
            except PreflightError as e:
                self.unknown = str(e).removeprefix("gpu.memory_pressure: ")
                raise
        return GpuTarget(self.spec.device, self.facts.uuid, self.facts.name)

    def preflight(self) -> None:
        self.target()
        assert self.facts is not None
        need = self._own_bytes()
        if self.spec.hold == "fixed" and need is not None and need > self.facts.free:
            raise PreflightError(f"gpu.memory_pressure: device {self.spec.device} has {format_size(self.facts.free)}"
                                 f" free, {format_size(need)} requested")
        if self.spec.leave_free is not None and parse_size(self.spec.leave_free) >= self.facts.free \
                and self.spec.hold == "fixed":
            raise PreflightError(f"gpu.memory_pressure: device {self.spec.device} has only "
                                 f"{format_size(self.facts.free)} free, less than leave_free")

    def _own_bytes(self) -> int | None:
        s, f = self.spec, self.facts
        if s.bytes_ is not None:
            return parse_size(s.bytes_)
        if s.percent is not None and f:
            return int(s.percent * f.total)
        return None

    def _amount(self) -> str:
        s = self.spec
        if s.fragment is not None:
            return (f"fill the device, leaving free memory as {s.fragment.holes} separate holes of "
                    f"{format_size(parse_size(s.fragment.hole_size))}; then measure the largest allocation that "
                    "still succeeds")
        if s.hold == "steady":
            level = (f"{s.percent:.1%} of total" if s.percent is not None else
                     f"total minus {s.leave_free} free" if s.leave_free is not None else
                     f"the used level at start plus {s.bytes_}")
            return (f"keep the device's used memory at {level}, re-measured every 100 ms (allocating or "
                    "giving back; every correction journaled)")
        what = (f"{s.bytes_}" if s.bytes_ is not None else f"{s.percent:.1%} of total" if s.percent is not None
                else f"all free memory but {s.leave_free}")
        n = self._own_bytes()
        return f"allocate {what}" + (f" ({format_size(n)})" if n and s.bytes_ is None else "") + " and hold it"

    def plan(self) -> list[str]:
        f = self.facts
        dev = (f"device {self.spec.device} ({f.name}, {f.uuid}, {format_size(f.free)} free of "
               f"{format_size(f.total)})" if f else f"device {self.spec.device} (facts unknown: {self.unknown})")
        ramp = f", ramping up over {self.spec.ramp:g}s" if self.spec.ramp else ""
        return [f"start a CUDA holder process on {dev}: {self._amount()}{ramp}",
                f"revert: SIGTERM the holder, which frees every allocation and exits (it also dies with chaoskit "
                f"and exits by itself after {self.ctx.lifetime_s:g}s)"]

    def prepare(self) -> GpuHolderRecord:
        token = f"chaoskit-gpuholder-{uuid.uuid4().hex}"
        d = state_dir() / "gpu"
        d.mkdir(parents=True, exist_ok=True)
        frag = self.spec.fragment
        return GpuHolderRecord(token=token, device=self.spec.device, target=self.spec.target(),
                               fragment=Holes(holes=frag.holes, hole_size=parse_size(frag.hole_size)) if frag else None,
                               status=str(d / f"{token}.status.json"), journal=str(d / f"{token}.corrections.jsonl"))

    def apply(self, record: GpuHolderRecord) -> GpuHolderRecord:
        until = time.time() + self.ctx.lifetime_s
        # the holder's PR_SET_PDEATHSIG fires when the spawning *thread* ends; the engine's apply threads live
        # until the run's event loop closes, which is after rollback
        ref = helper_proc.spawn(self.helper, record.token, [record.config(), f"{until:.3f}", str(os.getpid())],
                                f"GPU memory holder on device {record.device}",
                                extra_env=visible_devices_env(record.device))
        return record.model_copy(update={"holder": ref})

    @classmethod
    def revert(cls, record: GpuHolderRecord) -> None:
        helper_proc.stop(record.token)
        record.remove_files()

    @classmethod
    def observe_details(cls, record: GpuHolderRecord) -> dict[str, Any]:
        out: dict[str, Any] = {"in_effect": cls.observe(record)}
        try:
            status = record.holder_file(record.status)
            out["holder"] = json.loads(status.read_text()) if status else None
        except (OSError, ValueError):
            out["holder"] = None
        try:
            journal = record.holder_file(record.journal)
            lines = journal.read_text().splitlines() if journal else []
            out["corrections"] = [json.loads(x) for x in lines[-CORRECTIONS_IN_REPORT:]]
            out["corrections_total"] = len(lines)
        except (OSError, ValueError):
            out["corrections"], out["corrections_total"] = [], 0
        try:
            m = nvml.memory(record.device)
            out["nvml"] = {"total": m.total, "used": m.used, "free": m.free}
        except PreflightError as e:
            out["nvml"] = f"unavailable: {e}"
        return out
