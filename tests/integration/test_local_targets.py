"""The target layer on this host: a fault's target is resolved into a typed record (processes, a network
namespace, cgroup members, a GPU) when the plan is made and again when its step starts, and the journal and
ledger keep that record as the fault's placement. Real processes, a real namespace, real cgroups."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path

import pytest

from chaoskit.executors.layer import place
from chaoskit.injectors.cpu.fault import CpuThrottle, CpuThrottleSpec
from chaoskit.injectors.firewall.fault import Drop, DropSpec
from chaoskit.injectors.gpu.xid import XidEvent, XidSpec
from chaoskit.targets.netns import ns_inode
from tests.conftest import chaoskit, proc_state, wait_for, write
from tests.helpers.netpair import Pair

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="signals to any process, netns and cgroups need root")

NAME = "cktgt-respawn"
# A process named NAME, started again 50 ms after each time it dies, as a supervisor (systemd, kubelet) would.
SUPERVISOR = ("while :; do python3 -c 'import ctypes, time; ctypes.CDLL(None).prctl(15, b\"" + NAME
              + "\", 0, 0, 0); time.sleep(600)'; sleep 0.05; done")

EXPERIMENT = f"""\
apiVersion: chaoskit/v1
kind: Experiment
metadata: {{name: respawned-target}}
steadyState:
  probes:
    - {{name: ok, type: command, argv: ["true"], phases: [before, after]}}
method:
  - inject: {{type: process.signal, name: "^{NAME}$", signal: SIGKILL}}
    duration: 1s
  - inject: {{type: process.signal, name: "^{NAME}$"}}
    duration: 1s
"""


def named() -> list[int]:
    out = subprocess.run(["pgrep", "-x", NAME], capture_output=True, text=True).stdout
    return [int(p) for p in out.split()]


@pytest.fixture
def respawning():
    sup = subprocess.Popen(["bash", "-c", SUPERVISOR], start_new_session=True)
    try:
        wait_for(lambda: len(named()) == 1, 10)
        yield sup
    finally:
        os.killpg(sup.pid, signal.SIGKILL)
        sup.wait()
        wait_for(lambda: not named(), 5)


def test_each_step_targets_the_process_running_when_it_starts(tmp_path, state_dir, respawning):
    """Step 1 kills the process the plan found; its supervisor starts another; step 2 must stop that new one
    (resolved when the step starts), not the dead PID the plan saw, and the journal says which it was."""
    first = named()[0]
    run = chaoskit("run", str(write(tmp_path / "e.yaml", EXPERIMENT)), "--out", str(tmp_path / "o"), state=state_dir)
    out, err = run.communicate(timeout=60)
    assert run.returncode == 0, out + err
    events = [json.loads(x) for x in (tmp_path / "o" / "journal.jsonl").read_text().splitlines()]
    applied = [e for e in events if e["event"] == "fault_applied"]
    assert [e["executor"] for e in applied] == ["local", "local"]
    targets = [e["placement"]["target"] for e in applied]
    assert [t["kind"] for t in targets] == ["process", "process"]
    killed, stopped = ([p["pid"] for p in t["processes"]] for t in targets)
    assert killed == [first]
    assert len(stopped) == 1 and stopped[0] != first
    observed = [e for e in events if e["event"] == "fault_observed" and e["id"] == applied[1]["id"]]
    assert observed and observed[0]["details"]["in_effect"] is True  # it was stopped
    assert proc_state(stopped[0]) in ("S", "R")  # and continued on revert


def test_cgroup_target_records_each_process_where_it_was(sleeper):
    inj = CpuThrottle(CpuThrottleSpec(type="process.cpu_throttle", pid=sleeper.pid, cpu=0.5))
    place(inj)
    target = inj.placement().to_json()["target"]
    assert target["kind"] == "cgroup" and target["selector"] == f"PID {sleeper.pid}"
    (proc,) = target["procs"]
    assert (proc["pid"], proc["comm"]) == (sleeper.pid, "sleep")
    # the kernel's own view: the cpu controller's line of /proc/PID/cgroup ("N:cpu,cpuacct:/path" on v1)
    line = next(x for x in Path(f"/proc/{sleeper.pid}/cgroup").read_text().splitlines()
                if "cpu" in x.split(":")[1].split(",") or x.startswith("0::"))
    assert proc["from"].endswith(line.split(":", 2)[2].rstrip("/")) and proc["threads"][0]["tid"] == sleeper.pid
    assert inj.prepare().to_json()["procs"] == target["procs"]  # what apply moves is what the ledger names


def test_netns_target_names_the_namespace_by_inode():
    pair = Pair()
    try:
        inj = Drop(DropSpec(type="network.drop", target={"netns": pair.srv}, percent="50%"))
        place(inj)
        target = inj.placement().to_json()["target"]
        assert target == {"kind": "netns", "ns": pair.path(pair.srv), "ns_inode": ns_inode(pair.path(pair.srv)),
                          "label": f"netns {pair.srv}", "ifname": None, "ifindex": None}
        assert inj.prepare().ns_inode == target["ns_inode"]
    finally:
        pair.close()


def test_a_target_that_means_nothing_is_refused_at_placement():
    from chaoskit.errors import PreflightError

    inj = Drop(DropSpec(type="network.drop", target={"netns": "ckt-no-such-ns"}, percent="50%"))
    with pytest.raises(PreflightError, match="does not exist"):
        place(inj)


def test_gpu_target_without_asking_the_driver():
    """gpu.xid with a bus id needs no NVML: its target is that bus id (a GPU is not needed to test this)."""
    inj = XidEvent(XidSpec(type="gpu.xid", pci_bus_id="0000:3B:00.0", xid=79))
    place(inj)
    assert inj.placement().to_json() == {"target": {"kind": "gpu", "device": None, "uuid": None, "name": None,
                                          "pci_bus_id": "0000:3b:00.0"}}


PARALLEL = """\
apiVersion: chaoskit/v1
kind: Experiment
metadata: {name: one-cgroup-twice}
steadyState:
  probes:
    - {name: ok, type: command, argv: ["true"]}
method:
  - parallel:
      - inject: {type: process.cpu_throttle, cgroup: CG, cpu: 0.5}
        duration: 1s
      - inject: {type: process.cpu_throttle, cgroup: CG, cpu: 0.2}
        duration: 2s
"""


def test_two_limits_on_one_cgroup_in_a_parallel_block_are_refused_before_anything(tmp_path, state_dir):
    """Each would put back the limit it found, so the one ending last would restore the other's: exit 4."""
    from chaoskit.targets.cgroups import find_cpu_hierarchy

    hier = find_cpu_hierarchy()
    cg = hier.root / f"cktest-twice-{os.getpid()}"
    cg.mkdir()
    try:
        before = hier.read_limit(cg)
        exp = write(tmp_path / "e.yaml", PARALLEL.replace("CG", cg.name))
        run = chaoskit("run", str(exp), "--out", str(tmp_path / "o"), state=state_dir)
        out, err = run.communicate(timeout=60)
        assert run.returncode == 4, out + err
        assert f"already limits cgroup {cg}; their reverts would undo each other" in " ".join((out + err).split())
        assert hier.read_limit(cg) == before
    finally:
        cg.rmdir()
