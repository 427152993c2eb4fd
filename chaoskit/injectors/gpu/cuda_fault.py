"""gpu.cuda_fault: CUDA driver calls of a running process fail or stall (allocation, kernel launch, synchronisation)
through chaoskit's interposer, armed and disarmed through its control file: the process is not restarted.

The process must have been started with the interposer (`chaoskit cuda-wrap -- CMD`, or the environment that
`chaoskit cuda-wrap --print-env` prints); every process started from it inherits the same control file. On
Kubernetes (`kubernetes:` pods of a Deployment prepared once with `chaoskit cuda-wrap --deployment NS/NAME`, or in
the run with `prepare: restart`: a rollout before the fault, and another one on revert that restores the template)
a helper pod on each node arms the control file of each chosen pod's container, reached through its processes'
/proc/PID/root, and revert finds it again after a container restart through the pod's cgroup. The Kubernetes side
of `prepare: restart` (the Deployments' patch, the rollouts) is the executors' (executors.k8s_cuda_restart); its
record, PodRestartRecord, is declared here with the family's other records.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from types import MappingProxyType
from typing import Any, ClassVar, Literal, Self

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from chaoskit.errors import PreflightError
from chaoskit.gpu.cuda_fault_ctl import KINDS, Control, Rule, named_by
from chaoskit.injectors.base import NODE_EXECUTORS, Injector, NodeHelper, PodPreparation, RevertRecord
from chaoskit.injectors.placement import HelperPlacement
from chaoskit.injectors.process.fault import ProcessTargets, check_selector, check_targets
from chaoskit.model.types import Duration, StrictModel
from chaoskit.targets.kube import KubeNodeSelector
from chaoskit.targets.local import ProcessTarget
from chaoskit.targets.pod_procs import pod_pids, pod_uid_of
from chaoskit.targets.process import ProcessRef

# The CUresult values a rule may return, by the names of cuda.h.
CUDA_ERRORS: MappingProxyType[str, int] = MappingProxyType({
    "CUDA_ERROR_INVALID_VALUE": 1,
    "CUDA_ERROR_OUT_OF_MEMORY": 2,
    "CUDA_ERROR_ECC_UNCORRECTABLE": 214,
    "CUDA_ERROR_NVLINK_UNCORRECTABLE": 220,
    "CUDA_ERROR_ILLEGAL_ADDRESS": 700,
    "CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES": 701,
    "CUDA_ERROR_LAUNCH_TIMEOUT": 702,
    "CUDA_ERROR_HARDWARE_STACK_ERROR": 714,
    "CUDA_ERROR_ILLEGAL_INSTRUCTION": 715,
    "CUDA_ERROR_LAUNCH_FAILED": 719,
    "CUDA_ERROR_UNKNOWN": 999,
})
DEFAULT_ERRORS = MappingProxyType({"alloc": "CUDA_ERROR_OUT_OF_MEMORY", "launch": "CUDA_ERROR_LAUNCH_FAILED",
                                   "sync": "CUDA_ERROR_ILLEGAL_ADDRESS"})
CALLS = MappingProxyType({
    "alloc": "cuMemAlloc_v2, cuMemAllocManaged, cuMemAllocPitch_v2, cuMemAllocAsync, cuMemCreate",
    "launch": "cuLaunchKernel, cuLaunchKernelEx, cuGraphLaunch",
    "sync": "cuCtxSynchronize, cuStreamSynchronize, cuEventSynchronize",
})


class CallRule(StrictModel):
    """What happens to one kind of driver call while the fault is in effect."""

    share: float = Field(0.0, ge=0, le=1, description="share of the calls that fail with `error` instead of "
                                                      "running (0 to 1; drawn per call)")
    error: str | None = Field(None, description="the CUresult they return, by name (default: OUT_OF_MEMORY for "
                                                "alloc, LAUNCH_FAILED for launch, ILLEGAL_ADDRESS for sync)")
    delay: Duration = Field(0.0, ge=0, le=10, description="added before every call of this kind (e.g. '5ms')")

    @field_validator("error")
    @classmethod
    def _error(cls, v: str | None) -> str | None:
        if v is not None and v.upper() not in CUDA_ERRORS:
            raise ValueError(f"unknown CUDA error {v!r}; one of {', '.join(CUDA_ERRORS)}")
        return v if v is None else v.upper()

    @model_validator(mode="after")
    def _something(self) -> Self:
        if self.share == 0 and self.delay == 0:
            raise ValueError("give share > 0 (calls fail) or delay > 0 (calls stall), or both")
        return self

    def rule(self, kind: str) -> Rule:
        return Rule(self.share, CUDA_ERRORS[self.error or DEFAULT_ERRORS[kind]], self.delay)

    def words(self, kind: str) -> str:
        parts = [f"{self.share:.4g} of calls fail with {self.error or DEFAULT_ERRORS[kind]}"] if self.share else []
        return " and ".join(parts + ([f"each call {self.delay * 1000:g} ms later"] if self.delay else []))


class CudaFaultSpec(ProcessTargets):
    model_config = {"json_schema_extra": {"examples": [
        {"type": "gpu.cuda_fault", "name": "^vllm", "alloc": {"share": 0.2}, "sync": {"delay": "5ms"}}]}}

    type: Literal["gpu.cuda_fault"]
    alloc: CallRule | None = Field(None, description=f"device memory allocations ({CALLS['alloc']})")
    launch: CallRule | None = Field(None, description=f"kernel and graph launches ({CALLS['launch']})")
    sync: CallRule | None = Field(None, description=f"synchronisation ({CALLS['sync']})")
    kubernetes: KubeNodeSelector | None = Field(None, description="the chosen pods' container, whose Deployment "
                                                "was prepared once with `chaoskit cuda-wrap --deployment NS/NAME` "
                                                "(armed on each pod's node through a helper pod: no restart), or "
                                                "is prepared by this fault (`prepare: restart`)")
    prepare: Literal["none", "restart"] = Field(
        "none", description="with `kubernetes:`: `none`, the pods already run with the interposer (preflight "
        "refuses pods whose container does not set CHAOSKIT_CUDA_FAULT); `restart`, each Deployment of the chosen "
        "pods not prepared yet is prepared at apply like `chaoskit cuda-wrap --deployment` (a rollout: its pods "
        "restart, the run waits for it), the fault is armed in the new pods, and revert disarms them, then "
        "restores the template (a second rollout, waited for too); a Deployment prepared before the run stays so. "
        "The step's `timeout` must cover the rollout")
    rollout_timeout: Duration = Field(300.0, gt=0, le=3600, description="with `prepare: restart`: how long each "
                                      "rollout may take, at apply and at revert (e.g. '5m'); one that does not "
                                      "finish fails the step, naming the Deployment")

    @model_validator(mode="after")
    def _one_target(self) -> Self:
        check_selector(self.pid, self.name, self.child_of, self.kubernetes)
        if self.prepare == "restart" and self.kubernetes is None:
            raise ValueError("prepare: restart restarts the pods of a Deployment: it needs a kubernetes: target")
        return self

    @model_validator(mode="after")
    def _one_kind(self) -> Self:
        if not self.rules():
            raise ValueError("give at least one of alloc, launch, sync")
        return self

    def rules(self) -> dict[str, CallRule]:
        return {k: r for k in KINDS if (r := getattr(self, k)) is not None}

    def describe(self) -> str:
        return self.kubernetes.describe() if self.kubernetes is not None else super().describe()


class InContainer(BaseModel):
    """A control file reached through a container's process: the path the container knows it by, the process
    and its pod (to find the file again through another process of the pod after a container restart)."""

    model_config = ConfigDict(frozen=True)
    path: str
    pid: int
    pod_uid: str | None = None


class CudaFaultRecord(RevertRecord):
    controls: list[str]  # the control files armed (each may serve several processes)
    pids: list[int] = []
    baseline: dict[str, dict[str, int]] = {}  # per control file: calls/failed/delayed per kind when armed
    inside: dict[str, InContainer] = {}  # of the controls, those reached through a container's /proc/PID/root


class PodRestartRecord(RevertRecord):
    """The Kubernetes part of a gpu.cuda_fault with `prepare: restart` (the k8s-helper record's `restart`): the
    Deployments it prepared, restored on revert. Before apply, those it may prepare (each is restored only if its
    signed annotation names `owner`: a Deployment prepared by anyone else is left alone); after apply, those it
    did prepare, and the helpers' placement on the pods chosen after the rollout."""

    owner: str = Field(min_length=1)  # RUN/KEY, written into the annotation of each Deployment this fault prepares
    deployments: list[str]  # NAMESPACE/NAME
    timeout_s: float = Field(gt=0)  # each rollout's limit (the revert's too)
    placement: HelperPlacement | None = None  # the helpers' placement on the new pods (None: not applied yet)


def reachable(pid: int, path: str) -> str:
    """The control file a process names, as this process reaches it: the path itself when the process shares
    our root, else through the process's /proc/PID/root (a container's)."""
    try:
        theirs, ours = os.stat(f"/proc/{pid}/root"), os.stat("/")
    except OSError:
        return path
    if (theirs.st_dev, theirs.st_ino) == (ours.st_dev, ours.st_ino):
        return path
    return f"/proc/{pid}/root{path}" if path.startswith("/") else f"/proc/{pid}/cwd/{path}"


def interposed(pid: int) -> bool:
    """Whether the interposer library is mapped into the process."""
    try:
        return "libchaoskit-cudafault" in Path(f"/proc/{pid}/maps").read_text()
    except OSError:
        return False


class CudaFault(Injector[CudaFaultSpec, CudaFaultRecord]):
    type: ClassVar[str] = "gpu.cuda_fault"
    summary: ClassVar[str] = "CUDA driver calls fail or stall in processes started with the interposer"
    Spec = CudaFaultSpec
    spec: CudaFaultSpec
    Record = CudaFaultRecord
    independent_revert: ClassVar[bool] = True  # its own control files
    executors: ClassVar[frozenset[str]] = NODE_EXECUTORS
    target_field: ClassVar[str | None] = "kubernetes"
    # another container's environment, maps and root (/proc/PID/environ, maps, root) need ptrace access; the
    # control file is writable by every user (chaoskit.gpu.cuda_fault_install)
    node_helper: ClassVar[NodeHelper] = NodeHelper(capabilities=("SYS_PTRACE",))

    @classmethod
    def on_node(cls, spec: CudaFaultSpec, container_id: str) -> CudaFaultSpec:
        """The spec on a pod's node: the container's processes that were started with the interposer."""
        from chaoskit.targets.container import bare_id, container_pids

        pids = [p for p in container_pids(container_id) if named_by(p) is not None and interposed(p)]
        if not pids:
            raise LookupError(f"no process of container {bare_id(container_id)[:12]} was started with the CUDA "
                              "interposer: prepare its Deployment once with `chaoskit cuda-wrap --deployment "
                              "NAMESPACE/NAME` (a rollout restarts its pods)")
        return spec.model_copy(update={"kubernetes": None, "prepare": "none", "pid": pids})

    def pod_preparation(self) -> PodPreparation:
        """On pods: their containers must have been started with the interposer ("check"), or their Deployments
        are prepared by the run (`prepare: restart`)."""
        if self.spec.kubernetes is None:
            return "none"
        return "restart" if self.spec.prepare == "restart" else "check"

    def resolve_target(self) -> ProcessTarget:
        return ProcessTarget(self.spec.describe(), tuple(self.spec.select()))

    def _refs(self) -> list[ProcessRef]:
        return list(self.target_as(ProcessTarget).processes)

    def _controls(self) -> dict[str, list[int]]:
        """Each control file (as this process reaches it) and the selected PIDs that use it (PreflightError for a
        process without one)."""
        out: dict[str, list[int]] = {}
        for ref in self._refs():
            path = named_by(ref.pid)
            if path is None or not interposed(ref.pid):
                raise PreflightError(f"gpu.cuda_fault: PID {ref.pid} ({ref.comm}) was not started with the CUDA "
                                     "interposer; start it with `chaoskit cuda-wrap -- CMD` (or the environment "
                                     "`chaoskit cuda-wrap --print-env` prints)")
            out.setdefault(reachable(ref.pid, path), []).append(ref.pid)
        return out

    @staticmethod
    def _inside(controls: dict[str, list[int]]) -> dict[str, InContainer]:
        """Of the controls, those reached through a container's root: as the container names them."""
        out = {}
        for path, pids in controls.items():
            own = named_by(pids[0])
            if own is not None and path != own:
                out[path] = InContainer(path=own, pid=pids[0], pod_uid=pod_uid_of(pids[0]))
        return out

    def preflight(self) -> None:
        check_targets(self.type, self.spec, self._refs(), self.spec.describe(), "interpose")
        for path in self._controls():
            try:
                with Control(Path(path)) as c:
                    if c.armed:
                        raise PreflightError(f"gpu.cuda_fault: control file {path} is already armed (another "
                                             "gpu.cuda_fault in effect on these processes?)")
            except (OSError, ValueError) as e:
                raise PreflightError(f"gpu.cuda_fault: control file {path}: {e}") from None

    def plan(self) -> list[str]:
        rules = "; ".join(f"{k}: {r.words(k)}" for k, r in self.spec.rules().items())
        try:
            controls = self._controls()
        except PreflightError as e:
            return [f"{self.spec.describe()}: {rules} ({e})"]
        return [f"arm {path} (PIDs {', '.join(map(str, pids))}): {rules}; revert: disarm (calls go through; the "
                f"arming also expires by itself after {self.ctx.lifetime_s:g}s)" for path, pids in controls.items()]

    def prepare(self) -> CudaFaultRecord:
        controls = self._controls()
        return CudaFaultRecord(controls=list(controls), pids=[p for ps in controls.values() for p in ps],
                               inside=self._inside(controls))

    def apply(self, record: CudaFaultRecord) -> CudaFaultRecord:
        rules = {k: cr.rule(k) for k, cr in self.spec.rules().items()}
        baseline, until = {}, time.time() + self.ctx.lifetime_s
        for path in record.controls:
            with Control(Path(path)) as c:
                baseline[path] = {k: n.calls for k, n in c.counts().items()} | {
                    f"{k}_failed": n.failed for k, n in c.counts().items()}
                c.arm(rules, until)
        return record.model_copy(update={"baseline": baseline})

    @classmethod
    def revert(cls, record: CudaFaultRecord) -> None:
        r = record
        for path in r.controls:
            where = located(r, path)
            if where is None:
                ins = r.inside.get(path)
                if ins is not None and ins.pod_uid is not None and pod_pids(ins.pod_uid):
                    raise RuntimeError(f"gpu.cuda_fault: {ins.path} of pod {ins.pod_uid} cannot be reached to disarm: "
                                       "its container is not running (restarting?) and the armed file stays in "
                                       "the pod's volume; roll back again once it runs (or delete the pod)")
                continue  # gone with its processes (and its pod): nothing is armed
            try:
                with Control(where) as c:
                    c.disarm()
            except FileNotFoundError:
                continue

    @classmethod
    def observe(cls, record: CudaFaultRecord) -> bool:
        return any(where is not None and _armed(where) for where in (located(record, p) for p in record.controls))

    @classmethod
    def observe_details(cls, record: CudaFaultRecord) -> dict[str, Any]:
        """Per kind, the calls made since apply and how many failed (summed over the control files)."""
        r = record
        out: dict[str, Any] = {}
        for path in r.controls:
            base, where = r.baseline.get(path, {}), located(r, path)
            if where is None:
                continue
            try:
                with Control(where) as c:
                    counts = c.counts()
            except (OSError, ValueError):
                continue
            for k, n in counts.items():
                out[f"{k}_calls"] = out.get(f"{k}_calls", 0) + n.calls - base.get(k, 0)
                out[f"{k}_failed"] = out.get(f"{k}_failed", 0) + n.failed - base.get(f"{k}_failed", 0)
        out["alive"] = sum(1 for p in r.pids if os.path.exists(f"/proc/{p}"))
        return out


def located(r: CudaFaultRecord, path: str) -> Path | None:
    """Where a recorded control file is now. One reached through a container's process: that path while the
    process is still in its pod, else through any process of the pod that names the same file (the container
    restarted: its volume, and the armed file, stayed), else None (the pod is gone, and its volume with it)."""
    ins = r.inside.get(path)
    if ins is None:
        return Path(path)
    if ins.pod_uid is None:  # not in a pod's cgroup: only the process itself leads to the file
        return Path(path) if os.path.exists(f"/proc/{ins.pid}") else None
    if pod_uid_of(ins.pid) == ins.pod_uid:
        return Path(path)
    for pid in pod_pids(ins.pod_uid):
        if named_by(pid) == ins.path:
            return Path(reachable(pid, ins.path))
    return None


def _armed(path: Path) -> bool:
    try:
        with Control(path) as c:
            return c.armed
    except (OSError, ValueError):
        return False
