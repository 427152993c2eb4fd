"""Typed records of what a fault's target resolved to on this host (processes, a network namespace, cgroup
members, a GPU), as the ledger keeps them: executors.layer.place resolves them when the plan is made and again
when the step starts; the injector's plan, prepare and apply read them instead of looking again."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from chaoskit.targets.process import ProcessRef


@dataclass(frozen=True)
class ProcessTarget:
    """The running processes a selector (`pid`, `name`, `child_of`) meant, with their start times."""

    kind: ClassVar[str] = "process"
    selector: str  # the selector in words
    processes: tuple[ProcessRef, ...]

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "selector": self.selector, "processes": [r.to_json() for r in self.processes]}


@dataclass(frozen=True)
class NetnsTarget:
    """A network namespace (by path and inode, so a recreated one is told apart) and, for qdisc faults, the
    interface in it."""

    kind: ClassVar[str] = "netns"
    ns_path: str
    ns_inode: int
    label: str
    ifname: str | None = None
    ifindex: int | None = None

    def describe(self) -> str:
        return f"{self.ifname} (index {self.ifindex}) in {self.label}" if self.ifname else self.label

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "ns": self.ns_path, "ns_inode": self.ns_inode, "label": self.label,
                "ifname": self.ifname, "ifindex": self.ifindex}


@dataclass(frozen=True)
class CgroupTarget:
    """Who a cgroup fault confines, in one controller's hierarchy: an existing `cgroup`, or processes (each
    with its own and its threads' cgroups before the move: `procs`, as cgroup_move.proc_record gives them)."""

    kind: ClassVar[str] = "cgroup"
    hierarchy: dict[str, Any]  # Hierarchy.to_json() of the controller
    selector: str
    procs: tuple[dict[str, Any], ...] = ()
    cgroup: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "hierarchy": self.hierarchy, "selector": self.selector,
                "procs": list(self.procs), "cgroup": self.cgroup}


@dataclass(frozen=True)
class GpuTarget:
    """One GPU as the driver names it (any field the fault did not need to ask the driver for is None)."""

    kind: ClassVar[str] = "gpu"
    device: int | str | None
    uuid: str | None = None
    name: str | None = None
    pci_bus_id: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "device": self.device, "uuid": self.uuid, "name": self.name,
                "pci_bus_id": self.pci_bus_id}


LocalTarget = ProcessTarget | NetnsTarget | CgroupTarget | GpuTarget
