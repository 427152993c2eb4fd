"""Which GPU a pod's container was given, as its node names it: NVIDIA_VISIBLE_DEVICES in its init's environment
(UUIDs, indices, all), else its /dev/nvidiaN nodes (CDI), mapped to a UUID by NVML (the nvml_double TEST DOUBLE:
no NVML here). The /proc trees are fixture directories: a container's init is found by its cgroup line."""

from __future__ import annotations

from pathlib import Path

import pytest

from chaoskit.errors import PreflightError
from chaoskit.executors.layer import localize_on_node
from chaoskit.gpu import nvml
from chaoskit.injectors.gpu.memory_pressure import GpuMemoryPressure, GpuMemoryPressureSpec
from chaoskit.injectors.gpu.xid import XidEvent, XidSpec
from chaoskit.targets.container import ContainerNotFound, container_gpus
from tests.helpers.nvml_double import SimulatedNvml

CID = "ab" * 32
UUID_A, UUID_B = "GPU-aaaaaaaa-0000-0000-0000-000000000001", "GPU-bbbbbbbb-0000-0000-0000-000000000002"
SPEC = {"type": "gpu.memory_pressure", "bytes": "1GiB", "kubernetes": {"namespace": "prod", "selector": {"app": "llm"}}}


def fake_proc(tmp_path: Path, environ: dict[str, str], dev: tuple[str, ...] = ()) -> Path:
    """A /proc with one process, 4242, the container's init (environment and root filesystem's /dev as given)."""
    d = tmp_path / "proc" / "4242"
    (d / "root" / "dev").mkdir(parents=True)
    (d / "cgroup").write_text(f"0::/kubepods.slice/kubepods-pod1.slice/cri-containerd-{CID}.scope\n")
    (d / "environ").write_bytes(b"".join(f"{k}={v}\0".encode() for k, v in {"PATH": "/bin", **environ}.items()))
    for name in dev:
        (d / "root" / "dev" / name).touch()
    return tmp_path / "proc"


@pytest.mark.parametrize(("listed", "device", "want"), [
    (f"{UUID_A},{UUID_B}", 0, UUID_A),
    (f"{UUID_A},{UUID_B}", 1, UUID_B),
    (f"{UUID_A},{UUID_B}", UUID_B, UUID_B),
    ("3,5", 1, "5"),  # host indices, in the container's order
    ("all", 2, "2"),  # every GPU of the node: the container's index is the node's
])
def test_the_containers_gpu_by_its_index_or_uuid(tmp_path, listed, device, want):
    gpus = container_gpus(f"containerd://{CID}", fake_proc(tmp_path, {"NVIDIA_VISIBLE_DEVICES": listed}))
    assert gpus.pick(device) == want


def test_a_gpu_the_container_was_not_given_is_refused(tmp_path):
    gpus = container_gpus(CID, fake_proc(tmp_path, {"NVIDIA_VISIBLE_DEVICES": UUID_A}))
    with pytest.raises(LookupError, match=rf"the container has 1 GPU\(s\) \({UUID_A}; from NVIDIA_VISIBLE_DEVICES\), "
                                          "no index 1"):
        gpus.pick(1)
    with pytest.raises(LookupError, match=f"the container was not given GPU {UUID_B}"):
        gpus.pick(UUID_B)


def test_without_the_variable_its_device_nodes_say_which(tmp_path):
    """CDI injection sets NVIDIA_VISIBLE_DEVICES=void: /dev/nvidia3 (not nvidiactl, nvidia-uvm) is the GPU."""
    proc = fake_proc(tmp_path, {"NVIDIA_VISIBLE_DEVICES": "void"}, dev=("nvidiactl", "nvidia-uvm", "nvidia3", "null"))
    gpus = container_gpus(CID, proc)
    assert (gpus.devices, gpus.pick(0)) == (("minor:3",), "minor:3")


def test_a_container_without_a_gpu_or_not_here(tmp_path):
    proc = fake_proc(tmp_path, {})
    with pytest.raises(LookupError, match=r"container ababababab.. was given no GPU \(NVIDIA_VISIBLE_DEVICES is "
                                          r"unset and it has no /dev/nvidiaN device\)"):
        container_gpus(CID, proc)
    with pytest.raises(ContainerNotFound):
        container_gpus("cd" * 32, proc)


def test_on_the_node_the_spec_names_the_containers_gpu(tmp_path, monkeypatch: pytest.MonkeyPatch):
    proc = fake_proc(tmp_path, {"NVIDIA_VISIBLE_DEVICES": f"{UUID_A},{UUID_B}"})
    monkeypatch.setattr("chaoskit.targets.container.container_gpus",
                        lambda cid, _proc=proc: container_gpus(cid, _proc))
    local = localize_on_node(GpuMemoryPressure, {**SPEC, "device": 1}, f"containerd://{CID}")
    assert isinstance(local, GpuMemoryPressureSpec)  # what the agent applies
    assert local.model_dump(by_alias=True, exclude_defaults=True) == {"type": "gpu.memory_pressure", "bytes": "1GiB",
                                                                      "device": UUID_B}


def test_a_device_node_is_mapped_to_its_uuid_by_nvml(tmp_path, monkeypatch: pytest.MonkeyPatch):
    proc = fake_proc(tmp_path, {}, dev=("nvidia3",))
    monkeypatch.setattr("chaoskit.targets.container.container_gpus",
                        lambda cid, _proc=proc: container_gpus(cid, _proc))
    double = SimulatedNvml()
    monkeypatch.setattr(nvml, "module", lambda: double)
    local = localize_on_node(GpuMemoryPressure, SPEC, CID)
    assert local.device == "GPU-11111111-2222-3333-4444-555555555555"  # the double's GPU, minor 3
    assert "minor(h0)" in double.calls
    (proc / "4242" / "root" / "dev" / "nvidia3").rename(proc / "4242" / "root" / "dev" / "nvidia4")
    with pytest.raises(PreflightError, match=r"no GPU has device node /dev/nvidia4 \(1 GPU\(s\) visible to NVML\)"):
        localize_on_node(GpuMemoryPressure, SPEC, CID)


def test_on_the_node_an_xid_names_the_containers_gpu_or_the_bus_id_given(tmp_path, monkeypatch: pytest.MonkeyPatch):
    proc = fake_proc(tmp_path, {"NVIDIA_VISIBLE_DEVICES": f"{UUID_A},{UUID_B}"})
    monkeypatch.setattr("chaoskit.targets.container.container_gpus",
                        lambda cid, _proc=proc: container_gpus(cid, _proc))
    kube = SPEC["kubernetes"]
    first = localize_on_node(XidEvent, {"type": "gpu.xid", "xid": 79, "kubernetes": kube}, CID)  # no GPU named
    assert isinstance(first, XidSpec) and (first.device, first.pci_bus_id, first.kubernetes) == (UUID_A, None, None)
    bus = localize_on_node(XidEvent, {"type": "gpu.xid", "xid": 79, "pci_bus_id": "0000:3b:00.0", "kubernetes": kube},
                           CID)
    assert (bus.device, bus.pci_bus_id, bus.kubernetes) == (None, "0000:3b:00.0", None)
