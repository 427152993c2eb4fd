"""The injector contract: plan / prepare / apply / revert / observe, one class per fault family."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Generic, Literal, Protocol, TypeVar

from pydantic import BaseModel, ConfigDict, ValidationError

if TYPE_CHECKING:
    from chaoskit.injectors.placement import FaultPlacement, HelperPlacement
    from chaoskit.targets.cgroups import Hierarchy
    from chaoskit.targets.local import LocalTarget
    from chaoskit.targets.process import ProcessRef

T = TypeVar("T")
SpecT = TypeVar("SpecT", bound=BaseModel)

LOCAL = "local"  # the executor names a fault may declare (chaoskit.executors runs them)
K8S_HELPER = "k8s-helper"


@dataclass(frozen=True)
class NodeHelper:
    """What a fault's helper pod on a Kubernetes node is granted (everything else is dropped): Linux capabilities,
    host paths mounted at the same place, every GPU of the node through the NVIDIA container toolkit."""

    capabilities: tuple[str, ...] = ()
    host_paths: tuple[str, ...] = ()
    gpu: bool = False


# A fault in a pod's network namespace: entering it is setns(2) (SYS_ADMIN), reading another user's /proc/PID/ns
# is SYS_PTRACE, tc and nftables are NET_ADMIN.
NETNS_HELPER = NodeHelper(capabilities=("NET_ADMIN", "SYS_ADMIN", "SYS_PTRACE"))
# A limit on the container's own cgroup: no capability (root writes root's files in the host's cgroup tree,
# mounted from the host).
CGROUP_HELPER = NodeHelper(host_paths=("/sys/fs/cgroup",))
NODE_EXECUTORS = frozenset({LOCAL, K8S_HELPER})


class Forkserver(Protocol):
    """What forks a run's proxy helpers (injectors.forkserver.client.Forkserver)."""

    def spawn(self, token: str, args: list[str], what: str, extra_env: dict[str, str] | None = None
              ) -> ProcessRef: ...


@dataclass
class FaultContext:
    """What the run tells one fault: its step, how long it may live, the run, and where it runs: the executor
    and its helper placement, or the typed local target (set by the target layer, executors.layer.place, at
    preflight and again when the step starts); the run's proxy forkserver."""

    step: str = ""
    lifetime_s: float = 3600.0  # duration + timeout + grace: helper processes also expire by themselves
    run_id: str = ""
    executor: str = LOCAL
    placement: HelperPlacement | None = None
    target: LocalTarget | None = None
    forkserver: Forkserver | None = None  # the run's: its proxy helpers are forked from it (else each a new Python)


class RecordError(ValueError):
    """A revert record read back from the ledger does not have the shape its fault family writes."""


class RevertRecord(BaseModel):
    """A fault family's revert record as the ledger keeps it (plain JSON), read back into this model before a
    revert or observe: a torn or foreign record is refused with what is wrong instead of failing halfway through
    the undo. Keys the model does not name are left alone (a newer chaoskit may write more)."""

    model_config = ConfigDict(extra="ignore", frozen=True, defer_build=True)

    def to_json(self) -> dict[str, Any]:
        """The ledger's form of the record (plain JSON; read back by Injector.read_record)."""
        return self.model_dump(mode="json", by_alias=True)


RecordT = TypeVar("RecordT", bound=RevertRecord)
PodPreparation = Literal["none", "check", "restart"]


class Injector(ABC, Generic[SpecT, RecordT]):
    """One fault family, generic over its Spec and its Record: `prepare` and `apply` return the Record, `revert`
    and `observe` receive it. `revert` and `observe` are classmethods: they work from the record alone, in a fresh
    process (the watchdog, `chaoskit rollback`). What it can do is declared on the class. The ledger and a helper
    pod hold the record as plain JSON: `read_record` / `RevertRecord.to_json` are the one conversion each way
    (done by the executors, `from_ledger` / `to_ledger`)."""

    type: ClassVar[str]
    summary: ClassVar[str]
    Spec: ClassVar[type[BaseModel]]
    # True when reverting it never touches what another fault of the family changed (its own nft table, its
    # own helper process, a signal): the faults of one `parallel` block are then reverted at once. False for
    # faults that stack on one object (cgroup moves, qdiscs), which must be undone newest first.
    independent_revert: ClassVar[bool] = False
    # where its verbs can run: LOCAL (this host), K8S_HELPER (a helper pod on the node of a `kubernetes:` target)
    executors: ClassVar[frozenset[str]] = frozenset({LOCAL})
    # for K8S_HELPER: the dotted path of its spec's `kubernetes:` pod target (a targets.kube.KubeNodeSelector,
    # e.g. "kubernetes" or "target.kubernetes"), and what its helper pod is granted
    target_field: ClassVar[str | None] = None
    node_helper: ClassVar[NodeHelper] = NodeHelper()
    # True when its helper is forked from the run's forkserver (ctx.forkserver; the proxies): the run starts that
    # before the method
    forked: ClassVar[bool] = False
    # the module of the helper process it starts (`python -m MODULE`); None: it starts none. A helper imports
    # only what it runs (tests/unit/test_helper_imports.py holds it to that)
    helper: ClassVar[str | None] = None
    # True for a ledger-only type no experiment names (the reference deployment a run brought up): found by
    # injector_class, left out of INJECTORS and the experiment schema
    internal: ClassVar[bool] = False
    # what `chaoskit doctor` checks the host for on its behalf: ids of doctor's checks (doctor.NEEDS: "root",
    # "netem", "nftables", "cgroup-io", "cuda", "nvml", "kmsg", "kube", "native-sender", ...); a failed check
    # lists the faults that declare it as what it blocks
    host_needs: ClassVar[frozenset[str]] = frozenset()
    # the model of its revert record (a RevertRecord), checked by read_record: its verbs take and return it
    Record: ClassVar[type[RevertRecord] | None] = None

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if K8S_HELPER in cls.executors and not cls.target_field:
            raise TypeError(f"{cls.__name__}: runs in a k8s helper pod but declares no target_field")

    def __init__(self, spec: SpecT, ctx: FaultContext | None = None):
        self.spec: SpecT = spec
        self.ctx = ctx if ctx is not None else FaultContext()

    def placement(self) -> FaultPlacement | None:
        """Where the fault runs, for the ledger entry: the executor's placement, or the resolved local target
        (None: a fault with no target to resolve, such as host-wide pressure)."""
        from chaoskit.injectors.placement import LocalPlacement

        if self.ctx.placement is not None:
            return self.ctx.placement
        return LocalPlacement(self.ctx.target) if self.ctx.target is not None else None

    def resolve_target(self) -> LocalTarget | None:
        """What the spec's target means on this host now (PreflightError if it cannot mean anything); None for
        a fault that has no target. Called by the target layer; the injector reads it through target()."""
        return None

    def target(self) -> LocalTarget | None:
        """The target the layer resolved (resolved here when the injector is used without the layer)."""
        if self.ctx.target is None:
            self.ctx.target = self.resolve_target()
        return self.ctx.target

    def target_as(self, kind: type[T]) -> T:
        """target(), which is a `kind`: the record this injector's resolve_target returns."""
        t = self.target()
        if not isinstance(t, kind):
            raise TypeError(f"{self.type}: its target is a {type(t).__name__}, not a {kind.__name__}")
        return t

    @classmethod
    def cgroup_hierarchy(cls) -> Hierarchy | None:
        """For a fault that can limit a whole existing cgroup (its `cgroup:` field): the controller's hierarchy
        here, where a pod's container is then found as its cgroup; None for the others."""
        return None

    @classmethod
    def on_node(cls, spec: SpecT, container_id: str) -> SpecT | None:
        """For a fault whose pod target means something other than the container's processes or cgroup (a GPU):
        its spec as applied on the container's node, its `kubernetes:` target replaced; None for the others."""
        return None

    def preflight(self) -> None:
        """Raise PreflightError if this host cannot apply the fault (checked before anything is applied)."""

    # -- optional hooks (each has a default that does nothing) ------------------------------------------------
    def node_plan(self, pods: str) -> str | None:
        """For a fault in helper pods (k8s-helper): what the helper pod does on its node, in words, after `on node
        N: a helper pod (...)`; `pods` the node's chosen pods in words. None: the executor says "applies TYPE SPEC
        to PODS"."""
        return None

    @classmethod
    def revert_many(cls, records: list[RecordT]) -> None:
        """Revert many faults of this family at once (one nft transaction, one wait for many helpers): a speed-up
        the rollback takes for a batch; each fault is still reverted (a no-op when gone) and observed on its own
        after. By default nothing."""

    def pod_preparation(self) -> PodPreparation:
        """For a fault on Kubernetes pods whose containers must have been started prepared (gpu.cuda_fault: with
        the CUDA interposer): "check" (preflight refuses a pod that was not), "restart" (the k8s-helper executor
        prepares their Deployments and waits for the rollout before applying, and restores them on revert);
        "none" for the others."""
        return "none"

    @abstractmethod
    def plan(self) -> list[str]:
        """The exact changes `apply` will make, in words (for --dry-run and the journal)."""

    def prepare(self) -> RecordT:
        """The revert record known before apply; written to the ledger (fsync) before `apply` runs.
        It must be enough to undo a partially applied fault."""
        raise NotImplementedError(f"{type(self).__name__}: a fault family prepares its Record (an internal, "
                                  "ledger-only type is never prepared)")

    @abstractmethod
    def apply(self, record: RecordT) -> RecordT:
        """Apply the fault; return the final revert record."""

    @classmethod
    def from_ledger(cls, data: dict[str, Any]) -> RecordT:
        """The record the ledger (or a helper pod's request) holds as JSON, as the verbs take it: read_record."""
        return cls.read_record(data)  # type: ignore[no-any-return]

    @classmethod
    def to_ledger(cls, record: RecordT) -> dict[str, Any]:
        """The record as the ledger (or a helper pod's answer) keeps it: plain JSON."""
        return record.to_json()

    @classmethod
    def read_record(cls, record: dict[str, Any]) -> Any:
        """The record the ledger gave back as the family's Record (RecordError naming each wrong field)."""
        if cls.Record is None:
            raise TypeError(f"{cls.__name__} declares no Record")
        return cls.read_record_as(cls.Record, record)

    @classmethod
    def read_record_as(cls, model: type[BaseModel], record: dict[str, Any]) -> Any:
        """The record as `model` (a family with more than one record shape picks it), or RecordError naming each
        wrong field."""
        try:
            return model.model_validate(record)
        except ValidationError as e:
            wrong = "; ".join(f"{'.'.join(map(str, err['loc'])) or 'record'}: {err['msg']}" for err in e.errors())
            raise RecordError(f"{cls.type}: its revert record does not read back ({wrong})") from None

    @classmethod
    @abstractmethod
    def revert(cls, record: RecordT) -> None:
        """Undo from the record. Idempotent: reverting twice, or something already gone, succeeds."""

    @classmethod
    def observe(cls, record: RecordT) -> bool:
        """Is the fault in effect right now?"""
        return False

    @classmethod
    def holds(cls, record: RecordT) -> list[str]:
        """What the fault holds on its host while in effect (kernel objects with where they are, files, helper
        processes), one item each in words, from its record alone (`chaoskit status`). By default the record's
        own fields (holdings.summary of its ledger form); a family whose objects need more words than its record
        names (an nft table's family, the command that shows it) says them."""
        from chaoskit.injectors.holdings import summary

        return summary(cls.to_ledger(record))

    @classmethod
    def observe_details(cls, record: RecordT) -> dict[str, Any]:
        """What the fault is doing right now, for the journal (journaled after apply and before revert)."""
        return {"in_effect": cls.observe(record)}

    def ended_processes(self, record: RecordT) -> list[ProcessRef]:
        """The processes this fault ends itself (a terminating signal), from the record `prepare` made, before
        the apply: their exit is the fault, not news, and a replica they belong to is not expected to answer."""
        return []

    def watched_processes(self, record: RecordT) -> list[ProcessRef]:
        """The processes this fault acted on, alive when it did (from the record `apply` returned), whose exit
        while it is in effect the run reports: by default those of its resolved local target (a cgroup fault
        says the processes it moved); none for a whole cgroup, a network namespace or a GPU."""
        return self.target_processes()

    def target_processes(self) -> list[ProcessRef]:
        """The processes of its resolved local target: a process target's, a cgroup target's members."""
        from chaoskit.targets.local import CgroupTarget, ProcessTarget
        from chaoskit.targets.process import ProcessRef

        t = self.ctx.target
        if isinstance(t, ProcessTarget):
            return list(t.processes)
        if isinstance(t, CgroupTarget):
            return [ProcessRef.from_json(p) for p in t.procs]
        return []
