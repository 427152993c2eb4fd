"""The registries read the entry-point groups: each bundled class is registered under its own type, and an entry
point that names the wrong thing is refused with what is wrong."""

from __future__ import annotations

from importlib.metadata import EntryPoint, distribution

import pytest

import chaoskit.probes.registry as registry_module
from chaoskit.injectors import GROUP, INJECTORS, Injector, injector_class
from chaoskit.injectors.base import K8S_HELPER
from chaoskit.probes import PROBES, probe_class
from chaoskit.probes.registry import Registry, RegistryError
from chaoskit.reference.injectors import ReferenceDeployment, ReferenceGateway


def test_every_bundled_class_is_registered_under_its_type():
    own = distribution("chaoskit").entry_points
    assert {c.type for c in INJECTORS} | {"reference.deployment", "reference.gateway"} == set(own.select(
        group=GROUP).names) and {c.type for c in PROBES} == set(own.select(group="chaoskit.probes").names)
    assert all(injector_class(c.type) is c for c in INJECTORS) and all(probe_class(c.type) is c for c in PROBES)
    assert len({c.type for c in INJECTORS}) == len(INJECTORS) >= 21 and len(PROBES) >= 8


def test_internal_types_are_found_but_not_offered_to_experiments():
    assert injector_class("reference.deployment") is ReferenceDeployment
    assert injector_class("reference.gateway") is ReferenceGateway
    assert ReferenceDeployment not in INJECTORS and ReferenceGateway not in INJECTORS
    with pytest.raises(KeyError):
        injector_class("no.such")


def test_node_level_faults_declare_their_target_field_and_helper_pod_grants():
    node = {c.type: (c.target_field, c.node_helper.capabilities, c.node_helper.gpu) for c in INJECTORS
            if K8S_HELPER in c.executors}
    assert node == {
        "network.netem": ("target.kubernetes", ("NET_ADMIN", "NET_RAW", "SYS_ADMIN", "SYS_PTRACE"), False),
        "network.proxy": ("intercept.target.kubernetes", ("NET_ADMIN", "SYS_ADMIN", "SYS_PTRACE"), False),
        "llm.proxy": ("intercept.target.kubernetes", ("NET_ADMIN", "SYS_ADMIN", "SYS_PTRACE"), False),
        "mcp.proxy": ("intercept.target.kubernetes", ("NET_ADMIN", "SYS_ADMIN", "SYS_PTRACE"), False),
        "network.bandwidth": ("target.kubernetes", ("NET_ADMIN", "SYS_ADMIN", "SYS_PTRACE"), False),
        "network.drop": ("target.kubernetes", ("NET_ADMIN", "SYS_ADMIN", "SYS_PTRACE"), False),
        "network.partition": ("target.kubernetes", ("NET_ADMIN", "SYS_ADMIN", "SYS_PTRACE"), False),
        "process.cpu_throttle": ("kubernetes", (), False),
        "process.memory_limit": ("kubernetes", (), False),
        "disk.throttle": ("kubernetes", ("SYS_PTRACE",), False),
        "process.signal": ("kubernetes", ("KILL", "SYS_PTRACE"), False),
        "gpu.memory_pressure": ("kubernetes", ("SYS_PTRACE",), True),
        "gpu.xid": ("kubernetes", ("SYSLOG",), False),
        "gpu.cuda_fault": ("kubernetes", ("SYS_PTRACE",), False),
    }


def test_a_helper_pod_fault_without_a_target_field_is_refused_at_class_definition():
    with pytest.raises(TypeError, match="declares no target_field"):
        type("Broken", (Injector,), {"executors": frozenset({"local", K8S_HELPER})})


class _NotAFault:
    type = "demo.x"


class _Mislabelled(ReferenceGateway):
    type = "demo.other"


@pytest.mark.parametrize(("eps", "ask", "error"), [
    ([EntryPoint("demo.x", f"{__name__}:_NotAFault", GROUP)], "demo.x", "not a Injector"),
    ([EntryPoint("demo.x", f"{__name__}:_Mislabelled", GROUP)], "demo.x", "its type is 'demo.other'"),
    ([EntryPoint("demo.x", "a:B", GROUP), EntryPoint("demo.x", "c:D", GROUP)], "demo.x", "registered twice"),
    ([], "demo.x", "is empty: chaoskit is not installed"),
])
def test_a_wrong_entry_point_is_refused_with_the_reason(monkeypatch, eps, ask, error):
    monkeypatch.setattr(registry_module, "entry_points", lambda group: [e for e in eps if e.group == group])
    with pytest.raises(RegistryError, match=error):
        Registry(GROUP, Injector).get(ask)
