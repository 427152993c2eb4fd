"""Registry of probes (steady-state measurements), keyed by their `type` string."""

from __future__ import annotations

from chaoskit.probes.base import Probe
from chaoskit.probes.command import CommandProbe
from chaoskit.probes.ebpf import EbpfProbe
from chaoskit.probes.http import HttpProbe
from chaoskit.probes.kernel_log import KernelLogProbe
from chaoskit.probes.kube import KubePodsProbe
from chaoskit.probes.nvml import NvmlProbe
from chaoskit.probes.prom import PromProbe
from chaoskit.probes.slo import SloProbe

PROBES: tuple[type[Probe], ...] = (HttpProbe, CommandProbe, SloProbe, PromProbe, EbpfProbe, NvmlProbe, KernelLogProbe,
                                   KubePodsProbe)


def probe_class(type_name: str) -> type[Probe]:
    for cls in PROBES:
        if cls.type == type_name:
            return cls
    raise KeyError(type_name)


__all__ = ["PROBES", "Probe", "probe_class"]
