"""gpu.xid: write NVIDIA driver XID lines (`NVRM: Xid (PCI:...): N, ...`) to the kernel log via /dev/kmsg."""

from __future__ import annotations

import errno
import os
import re
import time
from types import MappingProxyType
from typing import Any, ClassVar, Literal

from pydantic import Field, field_validator, model_validator

from chaoskit.errors import PreflightError
from chaoskit.injectors.base import NODE_EXECUTORS, FaultContext, Injector, NodeHelper, RevertRecord
from chaoskit.model.types import Duration, StrictModel
from chaoskit.probes.kernel_log import KmsgTail
from chaoskit.targets.kube import KubeNodeSelector
from chaoskit.targets.local import GpuTarget

KMSG = "/dev/kmsg"
DEVKMSG_SYSCTL = "/proc/sys/kernel/printk_devkmsg"
DRIVER_LEVEL = 4  # KERN_WARNING: the level the XID lines of the driver show under in `dmesg -x`

# Short forms of the descriptions in NVIDIA's Xid catalogue (docs.nvidia.com/deploy/xid-errors).
XID_MESSAGES: MappingProxyType[int, str] = MappingProxyType({
    13: "Graphics Engine Exception",
    31: "GPU memory page fault",
    43: "GPU stopped processing",
    45: "Preemptive cleanup, due to previous errors",
    48: "Double Bit ECC Error",
    61: "Internal micro-controller breakpoint/warning",
    62: "Internal micro-controller halt",
    63: "ECC page retirement or row remapping recording event",
    64: "ECC page retirement or row remapper recording failure",
    74: "NVLink Error",
    79: "GPU has fallen off the bus.",
    92: "High single-bit ECC error rate",
    94: "Contained ECC error",
    95: "Uncontained ECC error",
    119: "GSP RPC Timeout",
    120: "GSP Error",
})

_BUS_RE = re.compile(r"^(?:(?P<domain>[0-9a-fA-F]{1,8}):)?(?P<bus>[0-9a-fA-F]{2}):(?P<dev>[0-9a-fA-F]{2})"
                     r"(?:\.(?P<fn>[0-7]))?$")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def parse_bus_id(text: str) -> tuple[int, int, int, int]:
    """(domain, bus, device, function) of `[domain:]bus:device[.function]` (NVML's `00000000:3B:00.0` too)."""
    m = _BUS_RE.match(text.strip())
    if not m:
        raise ValueError(f"pci_bus_id {text!r}: expected [domain:]bus:device[.function] in hex, e.g. 0000:3b:00.0")
    domain, bus, dev = int(m["domain"] or "0", 16), int(m["bus"], 16), int(m["dev"], 16)
    if dev > 0x1F:
        raise ValueError(f"pci_bus_id {text!r}: device {dev:#04x} is out of range (00..1f)")
    return domain, bus, dev, int(m["fn"] or "0")


def canonical_bus_id(text: str) -> str:
    """`dddd:bb:dd.f`, lower case."""
    domain, bus, dev, fn = parse_bus_id(text)
    return f"{domain:04x}:{bus:02x}:{dev:02x}.{fn}"


def driver_pci(text: str) -> str:
    """The bus id as the driver prints it in an XID line: `dddd:bb:dd` (no function)."""
    domain, bus, dev, _ = parse_bus_id(text)
    return f"{domain:04x}:{bus:02x}:{dev:02x}"


def xid_line(pci_bus_id: str, xid: int, message: str, pid: int | None = None,
             process_name: str | None = None) -> str:
    """One line in the driver's format: `NVRM: Xid (PCI:dddd:bb:dd): N, pid=P, name=NAME, MESSAGE`."""
    pid_text = str(pid) if pid is not None else "'<unknown>'"
    return (f"NVRM: Xid (PCI:{driver_pci(pci_bus_id)}): {xid}, pid={pid_text}, "
            f"name={process_name or '<unknown>'}, {message}")


def _no_control(value: str | None, what: str) -> str | None:
    if value is not None and _CONTROL.search(value):
        raise ValueError(f"{what} must be one line without control characters")
    return value


class XidSpec(StrictModel):
    type: Literal["gpu.xid"]
    pci_bus_id: str | None = Field(None, description="GPU the line names, e.g. '0000:3b:00.0' (printed as the "
                                                     "driver does: PCI:0000:3b:00)")
    device: int | str | None = Field(None, description="or a GPU index / UUID, resolved to its bus id through NVML")
    xid: int = Field(ge=1, le=255, description="XID number, e.g. 79 (GPU has fallen off the bus)")
    message: str | None = Field(None, min_length=1, max_length=400,
                                description="text after the XID number (default: the catalogue's short text)")
    pid: int | None = Field(None, gt=0, description="pid shown in the line (default '<unknown>')")
    process_name: str | None = Field(None, min_length=1, max_length=64,
                                     description="process name shown in the line (default <unknown>)")
    count: int = Field(1, ge=1, le=100, description="how many lines to write")
    interval: Duration = Field(0.0, ge=0, le=60, description="pause between repeated lines")
    level: int = Field(DRIVER_LEVEL, ge=0, le=7, description="kernel log priority (4 = warning, as the driver)")
    kubernetes: KubeNodeSelector | None = Field(None, description="the node of each chosen pod: the line goes to "
                                                "that node's kernel log, through a helper pod, naming the pod's GPU "
                                                "(`device`: its index among the container's GPUs, default 0; or "
                                                "pci_bus_id as the node sees it)")

    @field_validator("pci_bus_id")
    @classmethod
    def _bus(cls, v: str | None) -> str | None:
        if v is not None:
            parse_bus_id(v)
        return v

    @field_validator("device")
    @classmethod
    def _device(cls, v: int | str | None) -> int | str | None:
        from chaoskit.gpu.nvml import parse_device

        return v if v is None else parse_device(v)

    @field_validator("message")
    @classmethod
    def _message(cls, v: str | None) -> str | None:
        return _no_control(v, "message")

    @field_validator("process_name")
    @classmethod
    def _name(cls, v: str | None) -> str | None:
        return _no_control(v, "process_name")

    @model_validator(mode="before")
    @classmethod
    def _pod_gpu(cls, data: Any) -> Any:
        """On a pod's node, no GPU named means the container's first."""
        if isinstance(data, dict) and data.get("kubernetes") is not None and data.get("pci_bus_id") is None \
                and data.get("device") is None:
            return {**data, "device": 0}
        return data

    @model_validator(mode="after")
    def _check(self) -> XidSpec:
        if (self.pci_bus_id is None) == (self.device is None):
            raise ValueError("give exactly one of pci_bus_id (e.g. 0000:3b:00.0) or device (index or UUID)")
        if self.message is None and self.xid not in XID_MESSAGES:
            known = ", ".join(str(k) for k in XID_MESSAGES)
            raise ValueError(f"xid {self.xid} has no default message (known: {known}); set message")
        return self

    def text(self) -> str:
        return self.message if self.message is not None else XID_MESSAGES[self.xid]


def resolve_bus_id(device: int | str) -> str:
    """The PCI bus id NVML reports for a device index or UUID."""
    from chaoskit.gpu import nvml

    try:
        with nvml.session() as nv:
            bus = nv.nvmlDeviceGetPciInfo(nvml.handle(nv, device)).busId
    except PreflightError as e:
        raise PreflightError(f"gpu.xid: {e}") from None
    return canonical_bus_id(bus.decode() if isinstance(bus, bytes) else str(bus))


def check_kmsg_writable() -> None:
    try:
        os.close(os.open(KMSG, os.O_WRONLY))
    except OSError as e:
        hint = " (kernel.printk_devkmsg = off: sysctl -w kernel.printk_devkmsg=on)" if _devkmsg_off() else \
            " (needs root)" if e.errno in (errno.EACCES, errno.EPERM) else ""
        raise PreflightError(f"gpu.xid: cannot write {KMSG}: {e.strerror}{hint}") from None
    if _devkmsg_off():
        raise PreflightError(f"gpu.xid: cannot write {KMSG}: the kernel drops lines written there "
                             "(kernel.printk_devkmsg = off; sysctl -w kernel.printk_devkmsg=on)")


def _devkmsg_off() -> bool:
    try:
        with open(DEVKMSG_SYSCTL) as f:
            return f.read().strip() == "off"
    except OSError:
        return False


def write_kmsg(line: str, level: int) -> None:
    """One record, one write(). A fresh fd per line: the kernel rate-limits writes per open file (10 per 5 s)
    and drops the rest silently."""
    data = f"<{level}>{line}\n".encode()
    fd = os.open(KMSG, os.O_WRONLY)
    try:
        n = os.write(fd, data)
    finally:
        os.close(fd)
    if n != len(data):
        raise OSError(f"short write to {KMSG}: {n} of {len(data)} bytes")


class WrittenLine(RevertRecord):
    """One XID line apply wrote: when, and its kmsg sequence number (None where /dev/kmsg was unreadable)."""

    line: str
    at: float
    seq: int | None = None


class XidRecord(RevertRecord):
    """gpu.xid's record: an event, so revert does nothing with it; it reads back so that a foreign record is
    refused, and observe_details reports the lines written."""

    event: Literal[True]
    note: str = ""
    pci_bus_id: str = Field(pattern=r"^[0-9a-f]{4,8}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$")
    xid: int = Field(ge=1, le=255)
    level: int = Field(ge=0, le=7)
    lines: list[str] = Field(default_factory=list)
    written: list[WrittenLine] = Field(default_factory=list)


class XidEvent(Injector[XidSpec, XidRecord]):
    type: ClassVar[str] = "gpu.xid"
    host_needs: ClassVar[frozenset[str]] = frozenset({"root", "kmsg", "nvml"})
    executors: ClassVar[frozenset[str]] = NODE_EXECUTORS
    target_field: ClassVar[str | None] = "kubernetes"
    # the node's kernel log: written through the host's /dev/kmsg, read back (CAP_SYSLOG) to confirm each line
    node_helper: ClassVar[NodeHelper] = NodeHelper(capabilities=("SYSLOG",), host_paths=("/dev/kmsg",))
    Record = XidRecord
    summary: ClassVar[str] = "write NVIDIA driver XID lines for a GPU to the kernel log (an event: nothing to revert)"
    Spec = XidSpec
    spec: XidSpec

    def __init__(self, spec: XidSpec, ctx: FaultContext | None = None):
        super().__init__(spec, ctx)
        self._bus: str | None = None

    @classmethod
    def on_node(cls, spec: XidSpec, container_id: str) -> XidSpec:
        """The spec on a pod's node: a pci_bus_id as given; a `device` becomes the node's name for the container's
        GPU (as gpu.memory_pressure does)."""
        from chaoskit.injectors.gpu.memory_pressure import node_device

        if spec.pci_bus_id is not None:
            return spec.model_copy(update={"kubernetes": None})
        device = node_device(container_id, spec.device if spec.device is not None else 0)
        return spec.model_copy(update={"kubernetes": None, "device": device})

    def bus_id(self) -> str:
        """The GPU's bus id, `dddd:bb:dd.f`; a `device` is resolved through NVML once."""
        if self._bus is None:
            s = self.spec
            if s.pci_bus_id is not None:
                self._bus = canonical_bus_id(s.pci_bus_id)
            else:
                assert s.device is not None  # the spec holds exactly one of the two
                self._bus = resolve_bus_id(s.device)
        return self._bus

    def lines(self) -> list[str]:
        s = self.spec
        return [xid_line(self.bus_id(), s.xid, s.text(), s.pid, s.process_name)] * s.count

    def resolve_target(self) -> GpuTarget:
        return GpuTarget(self.spec.device, pci_bus_id=self.bus_id())

    def preflight(self) -> None:
        check_kmsg_writable()

    def plan(self) -> list[str]:
        s = self.spec
        every = f", {s.interval:g}s apart" if s.count > 1 and s.interval else ""
        times = f"{s.count} times{every}" if s.count > 1 else "once"
        return [f"write to {KMSG} at priority {s.level}, {times}: {self.lines()[0]}",
                "revert: nothing (an XID is an event: the kernel log keeps the line)"]

    def prepare(self) -> XidRecord:
        s = self.spec
        return XidRecord(event=True, note="an event cannot be taken back; revert does nothing",
                         pci_bus_id=self.bus_id(), xid=s.xid, level=s.level, lines=self.lines(), written=[])

    def apply(self, record: XidRecord) -> XidRecord:
        tail = _tail_or_none()
        written: list[WrittenLine] = []
        try:
            for i, line in enumerate(record.lines):
                if i and self.spec.interval:
                    time.sleep(self.spec.interval)
                write_kmsg(line, record.level)
                written.append(WrittenLine(line=line, at=time.time(), seq=None))
            if tail is not None:
                written = _with_sequence_numbers(written, tail.read())
        finally:
            if tail is not None:
                tail.close()
        return record.model_copy(update={"written": written})

    @classmethod
    def revert(cls, record: XidRecord) -> None:
        """An event cannot be taken back: nothing to do (a record that is not gpu.xid's was refused reading it)."""

    @classmethod
    def observe(cls, record: XidRecord) -> bool:
        return False  # an event, not a state

    @classmethod
    def observe_details(cls, record: XidRecord) -> dict[str, Any]:
        r = record
        return {"in_effect": False, "event": True, "lines_written": len(r.written), "seq": [w.seq for w in r.written]}


def _tail_or_none() -> KmsgTail | None:
    """A reader after the newest record, to read back what apply writes (None where /dev/kmsg is unreadable)."""
    tail = KmsgTail(KMSG)
    try:
        tail.open()
    except OSError:
        return None
    return tail


def _with_sequence_numbers(written: list[WrittenLine], records: list[tuple[int, str]]) -> list[WrittenLine]:
    """The written lines with their kmsg sequence numbers; a line the kernel dropped is an error."""
    pending, out = iter(records), []
    for w in written:
        seq = next((n for n, msg in pending if msg == w.line), None)
        if seq is None:
            raise RuntimeError(f"wrote an XID line to {KMSG} but it is not in the kernel log "
                               f"(dropped by the kernel? check kernel.printk_devkmsg): {w.line}")
        out.append(w.model_copy(update={"seq": seq}))
    return out
