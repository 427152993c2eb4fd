"""Process trees through psutil, on real processes the tests start: descendants, parent, process-group members,
names, and the PID + start-time identity (a ProcessRef with the wrong start time is never alive)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass

import psutil
import pytest

from chaoskit.injectors.process.fault import ProcessSignal, descendants, protected_pids, select_processes
from chaoskit.reference.vllm import engine_core_pid
from chaoskit.targets.process import (
    ProcessRef,
    cmdline,
    find_by_name,
    find_by_token,
    group_members,
    is_alive,
    parent_pid,
    proc_ref,
    proc_state,
)
from tests.conftest import wait_for

TICK = os.sysconf("SC_CLK_TCK")
# root -> ck-child -> ck-grandchild; root -> VLLM::EngineCore (comm cut to 15 characters); root -> ck-zombie (exits,
# never reaped). Each fork names itself with prctl(PR_SET_NAME) and reports "name pid" on stdout.
TREE = r"""
import ctypes, os, sys, time

def spawn(name, body):
    pid = os.fork()
    if pid == 0:
        ctypes.CDLL(None).prctl(15, name.encode(), 0, 0, 0)
        body()
        os._exit(0)
    os.write(1, f"{name} {pid}\n".encode())

def nap():
    time.sleep(300)

def child():
    spawn("ck-grandchild", nap)
    nap()

spawn("ck-child", child)
spawn("VLLM::EngineCore", nap)
spawn("ck-zombie", lambda: None)
nap()
"""
NAMES = ("ck-child", "ck-grandchild", "VLLM::EngineCore", "ck-zombie")


@dataclass
class Tree:
    root: subprocess.Popen
    token: str
    pids: dict[str, int]


@pytest.fixture
def tree() -> Iterator[Tree]:
    token = f"ck-tree-{uuid.uuid4().hex[:8]}"
    root = subprocess.Popen([sys.executable, "-c", TREE, token], stdout=subprocess.PIPE, text=True,
                            start_new_session=True)  # its own process group: the teardown kills only that
    try:
        pids: dict[str, int] = {}
        while len(pids) < len(NAMES):
            name, pid = root.stdout.readline().rsplit(" ", 1)
            pids[name] = int(pid)
        wait_for(lambda: proc_state(pids["ck-zombie"]) == "Z")
        wait_for(lambda: all(proc_ref(pids[n]).comm.startswith(n[:15]) for n in NAMES[:3]))
        yield Tree(root, token, pids)
    finally:
        os.killpg(root.pid, signal.SIGKILL)
        root.wait()


def test_descendants_are_the_live_children_and_grandchildren(tree):
    found = descendants(tree.root.pid)
    live = {tree.pids["ck-child"], tree.pids["ck-grandchild"], tree.pids["VLLM::EngineCore"]}
    assert [r.pid for r in found] == sorted(live)  # by PID, without the zombie, without root itself
    assert {r.comm for r in found} == {"ck-child", "ck-grandchild", "VLLM::EngineCor"}
    assert [r.pid for r in descendants(tree.pids["ck-child"])] == [tree.pids["ck-grandchild"]]
    assert descendants(tree.pids["ck-grandchild"]) == []
    assert os.getpid() not in {r.pid for r in descendants(os.getppid())}  # never chaoskit itself


def test_descendants_of_a_zombie_or_a_gone_process_are_none(tree):
    assert descendants(tree.pids["ck-zombie"]) == []
    assert descendants(4_000_000) == []


def test_child_of_narrows_a_name_selection_to_that_tree(tree):
    """child_of + name: the processes of that name among that PID's descendants only, never one of that name
    elsewhere (ck-child itself matches the name, and is not its own descendant)."""
    child, grandchild = tree.pids["ck-child"], tree.pids["ck-grandchild"]
    assert {child, grandchild} <= {r.pid for r in select_processes(None, "^ck-")}  # the name alone: both
    assert [r.pid for r in select_processes(None, "^ck-", child_of=child)] == [grandchild]
    assert {r.pid for r in select_processes(None, "^ck-", child_of=tree.root.pid)} == {child, grandchild}
    spec = ProcessSignal.Spec(type="process.signal", name="^ck-", child_of=child, select="all")
    assert [r.pid for r in ProcessSignal(spec).resolve_target().processes] == [grandchild]


def test_parent_pid_and_names(tree):
    assert parent_pid(tree.pids["ck-grandchild"]) == tree.pids["ck-child"]
    assert parent_pid(tree.pids["ck-child"]) == tree.root.pid
    assert parent_pid(tree.root.pid) == os.getpid()
    assert parent_pid(4_000_000) is None
    assert tree.token in cmdline(tree.root.pid) and cmdline(4_000_000) == []
    forks = {tree.pids[n] for n in NAMES[:3]}  # forks share root's command line (prctl renames only comm)
    assert {r.pid for r in find_by_token(tree.token)} == {tree.root.pid, *forks}
    assert [r.pid for r in find_by_name(r"^ck-grandchild$")] == [tree.pids["ck-grandchild"]]
    assert find_by_name(r"^ck-zombie$") == []  # zombies are not matches


def test_group_members_are_the_live_processes_of_the_group(tree):
    want = {tree.root.pid, tree.pids["ck-child"], tree.pids["ck-grandchild"], tree.pids["VLLM::EngineCore"]}
    assert group_members(tree.root.pid) == sorted(want)
    assert os.getpid() not in group_members(tree.root.pid)
    assert group_members(4_000_000) == []


def test_engine_core_is_found_among_that_servers_children_only(tree):
    assert engine_core_pid(tree.root.pid) == tree.pids["VLLM::EngineCore"]
    assert engine_core_pid(tree.pids["ck-child"]) is None  # another parent's EngineCore is not this one's
    assert engine_core_pid(4_000_000) is None


def test_protected_pids_are_init_chaoskit_and_its_ancestors():
    protected = protected_pids()
    assert {1, os.getpid(), os.getppid()} <= protected
    assert protected == {1, os.getpid(), *(p.pid for p in psutil.Process().parents())}


def test_start_time_stays_clock_ticks_since_boot(tree):
    """Ledgers on disk store start_time as /proc/PID/stat field 22 (clock ticks since boot): same unit as before."""
    ref = proc_ref(tree.pids["ck-child"])
    with open(f"/proc/{ref.pid}/stat", "rb") as f:
        field22 = int(f.read().rpartition(b")")[2].split()[19])
    assert isinstance(ref.start_time, int) and ref.start_time == field22
    since_boot = psutil.Process(ref.pid).create_time() - psutil.boot_time()
    assert abs(ref.start_time / TICK - since_boot) < 1.5
    assert proc_ref(tree.root.pid).start_time <= ref.start_time


def test_a_ref_with_the_wrong_start_time_is_not_alive(tree):
    """PID-reuse safety: the same PID with another start time is another process; it is never signalled."""
    pid = tree.pids["ck-child"]
    ref = proc_ref(pid)
    assert is_alive(ref) and is_alive(ProcessRef.from_json(ref.to_json()))
    stored = {"pid": pid, "start_time": ref.start_time}  # a ledger record from before (no comm)
    assert is_alive(ProcessRef.from_json(stored))
    for wrong in (ref.start_time - 1, ref.start_time + 1, 0):
        assert not is_alive(ProcessRef(pid, wrong, ref.comm))
    reused = {"signal": "SIGSTOP", "targets": [ProcessRef(pid, ref.start_time + 1, ref.comm).to_json()]}
    with pytest.raises(RuntimeError, match="every target exited"):
        ProcessSignal(ProcessSignal.Spec(type="process.signal", pid=pid)).apply(ProcessSignal.read_record(reused))
    assert proc_state(pid) not in ("T", "t")  # not stopped: the wrong identity was not signalled
    assert not is_alive(proc_ref(tree.pids["ck-zombie"]))  # a zombie is not alive either


def test_a_ref_is_not_alive_once_its_process_is_gone(tree):
    ref = proc_ref(tree.pids["ck-child"])
    os.kill(ref.pid, signal.SIGKILL)  # the root does not reap it: a zombie first
    wait_for(lambda: proc_state(ref.pid) == "Z")
    assert not is_alive(ref)
    assert proc_ref(4_000_000) is None and proc_state(4_000_000) is None
    assert not is_alive(ProcessRef(4_000_000, 1))
