"""process.cpu_throttle and host.cpu_stress on real processes and real cgroups made by the tests; child_of
selection on a real process tree. CPU use is measured from /proc/PID/stat (utime + stime) over ~1 s."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from chaoskit.errors import PreflightError
from chaoskit.injectors.cpu.fault import CpuStress, CpuStressSpec, CpuThrottle, CpuThrottleSpec
from chaoskit.injectors.process.fault import ProcessSignal, ProcessSignalSpec
from chaoskit.targets.cgroups import CpuHierarchy, IoHierarchy, find_cpu_hierarchy
from chaoskit.targets.process import is_alive, proc_state
from tests.conftest import ROOT, wait_for
from tests.helpers import cgroup_check

TICK = os.sysconf("SC_CLK_TCK")
# A busy process with a second (sleeping) thread; on SIGUSR1 it forks a sleeping child and prints its PID.
BUSY = """
import os, signal, sys, threading, time
def fork(*_):
    pid = os.fork()
    if pid == 0:
        time.sleep(600); os._exit(0)
    print(pid, flush=True)
signal.signal(signal.SIGUSR1, fork)
threading.Thread(target=time.sleep, args=(600,), daemon=True).start()
print("ready", flush=True)
while True:
    pass
"""


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def cpu_rate(pid: int, window: float = 1.0) -> float:
    """CPUs used by `pid` (all threads) over `window` seconds."""
    a, t0 = cpu_seconds(pid), time.monotonic()
    time.sleep(window)
    return (cpu_seconds(pid) - a) / (time.monotonic() - t0)


def best_rate(pid: int, tries: int = 3) -> float:
    """The best of a few windows: on a shared 2-core box other work can take a window's CPU; a throttle cannot
    be exceeded, so the worst case of 'throttled' needs one window, 'not throttled' the best of a few."""
    best = 0.0
    for _ in range(tries):
        best = max(best, cpu_rate(pid))
        if best > 0.6:
            break
    return best


def cgroup_in(hier: CpuHierarchy, pid: int, tid: int | None = None) -> Path | None:
    return hier.cgroup_of(pid, tid)


def threads(pid: int) -> list[int]:
    return sorted(int(t) for t in os.listdir(f"/proc/{pid}/task"))


@pytest.fixture
def hier() -> CpuHierarchy:
    """Skipped only where /proc/mounts shows no hierarchy with cpu (chaoskit's finder must find the one there is)."""
    return cgroup_check.hierarchy_or_skip(find_cpu_hierarchy, "cpu", "cpu")


@pytest.fixture
def test_cgroups(hier: CpuHierarchy) -> Iterator[list[Path]]:
    """Two throwaway cgroups (cktest-*, not chaoskit-*) to start targets in; emptied and removed at the end.
    They get 10x the default CPU weight, so what is measured in them does not depend on what else the shared
    box runs (the chaoskit cgroup keeps the default weight: a quota is a ceiling whatever the weight)."""
    made = []
    for tag in ("a", "b"):
        cg = hier.root / f"cktest-cpu-{tag}-{uuid.uuid4().hex[:8]}"
        cg.mkdir()
        made.append(cg)
        weight = cg / ("cpu.weight" if hier.version == 2 else "cpu.shares")
        if weight.exists():
            weight.write_text("1000\n" if hier.version == 2 else "10240\n")
    yield made
    for cg in made:
        for pid in IoHierarchy.procs(cg):
            try:
                IoHierarchy.move(pid, hier.root)
            except OSError:
                pass
        wait_for(lambda cg=cg: not IoHierarchy.procs(cg), 3)
        cg.rmdir()


@pytest.fixture
def busy() -> Iterator[subprocess.Popen]:
    proc = subprocess.Popen([sys.executable, "-c", BUSY], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
    wait_for(lambda: len(threads(proc.pid)) == 2, 3)
    yield proc
    proc.kill()
    proc.wait()


def throttle(**kw) -> CpuThrottle:
    return CpuThrottle(CpuThrottleSpec(type="process.cpu_throttle", **kw))


def test_throttle_caps_cpu_and_revert_restores_every_thread(hier, test_cgroups, busy):
    home_a, home_b = test_cgroups
    main_tid, side_tid = threads(busy.pid)
    IoHierarchy.move(busy.pid, home_a)
    if hier.version == 1:  # v1 lets threads of one process sit in different cgroups: each must come back home
        hier.move_task(busy.pid, side_tid, home_b)
    else:
        home_b = home_a
    before = best_rate(busy.pid)
    assert before > 0.6, f"the busy child only got {before:.2f} CPU before any throttle (host too loaded?)"

    inj = throttle(pid=busy.pid, cpu=0.2, period="100ms")
    inj.preflight()
    plan = inj.plan()
    record = inj.prepare()
    cg = record.path
    assert cg.name.startswith("chaoskit-") and str(cg) in plan[0] and "0.2 CPU" in plan[0]
    assert {t.tid: t.from_ for t in record.procs[0].threads} == {main_tid: str(home_a), side_tid: str(home_b)}
    try:
        record = inj.apply(record)
        assert CpuThrottle.observe(record) and [r.pid for r in inj.watched_processes(record)] == [busy.pid]
        assert all(cgroup_in(hier, busy.pid, t) == cg for t in threads(busy.pid)), "every thread is moved"
        assert hier.read_limit(cg) == (20000, 100000)
        during = cpu_rate(busy.pid, 1.5)
        assert during <= 0.3, f"throttled to 0.2 CPU but used {during:.2f}"
        assert hier.stat(cg).get("nr_throttled", 0) > 0
        details = CpuThrottle.observe_details(record)
        assert details["in_effect"] and details["quota_us"] == 20000 and details["tasks"] == 2

        # a child forked while throttled starts in the chaoskit cgroup; revert sends it where its parent came from
        busy.send_signal(signal.SIGUSR1)
        forked = int(busy.stdout.readline())  # type: ignore[union-attr]
        assert cgroup_in(hier, forked) == cg
    finally:
        CpuThrottle.revert(record)
    try:
        assert not cg.exists()
        assert not CpuThrottle.observe(record)
        assert cgroup_in(hier, busy.pid, main_tid) == home_a and cgroup_in(hier, busy.pid, side_tid) == home_b
        assert cgroup_in(hier, forked) == home_a
        after = best_rate(busy.pid)
        assert after > 0.6, f"after revert the child still only gets {after:.2f} CPU"
        CpuThrottle.revert(record)  # twice is fine
        print(f"\nCPU of a busy process: before {before:.2f}, throttled to 0.2: {during:.2f}, after revert {after:.2f}")
    finally:
        os.kill(forked, signal.SIGKILL)


def test_an_existing_cgroup_gets_its_own_limit_and_has_it_restored(hier, test_cgroups, busy):
    """`cgroup:` (what a pod's container becomes on its node): the limit is written on that cgroup, nothing is
    moved, and revert puts back the limit it had (here one set beforehand: 0.9 CPU), not "unlimited"."""
    home = test_cgroups[0]
    IoHierarchy.move(busy.pid, home)
    hier.write_limit(home, 90000, 100000)
    inj = throttle(cgroup=home.name, cpu=0.2, period="100ms")
    inj.preflight()
    plan = inj.plan()
    assert str(home) in plan[0] and "0.2 CPU" in plan[0] and "90000" in plan[1]
    record = inj.prepare()
    assert (record.cgroup, record.dedicated, record.previous) == (str(home), False, (90000, 100000))
    assert record.to_json()["previous"] == [90000, 100000]  # as the ledger has always kept it
    try:
        record = inj.apply(record)
        assert CpuThrottle.observe(record) and hier.read_limit(home) == (20000, 100000)
        during = cpu_rate(busy.pid, 1.5)
        assert during <= 0.3, f"throttled to 0.2 CPU but used {during:.2f}"
        assert cgroup_in(hier, busy.pid) == home, "nothing is moved"
    finally:
        CpuThrottle.revert(record)
    assert hier.read_limit(home) == (90000, 100000) and home.is_dir() and not CpuThrottle.observe(record)
    CpuThrottle.revert(record)  # twice is fine
    assert hier.read_limit(home) == (90000, 100000)
    # a limit someone else set since (a later fault, the kubelet) is not ours to put back
    record = inj.apply(inj.prepare())
    hier.write_limit(home, 50000, 100000)
    CpuThrottle.revert(record)
    assert hier.read_limit(home) == (50000, 100000)


def test_cgroup_target_must_exist_and_is_one_of_the_targets(hier):
    with pytest.raises(PreflightError, match="does not exist"):
        throttle(cgroup="cktest-no-such-cgroup", cpu=0.5).preflight()
    with pytest.raises(ValueError, match="exactly one target"):
        throttle(cgroup="x", pid=1, cpu=0.5)


def test_revert_from_the_record_alone_in_a_fresh_process(hier, test_cgroups, busy):
    IoHierarchy.move(busy.pid, test_cgroups[0])
    inj = throttle(pid=[busy.pid], cpu="20%", period="50ms")
    record = inj.apply(inj.prepare())
    cg = record.path
    try:
        assert hier.read_limit(cg) == (10000, 50000) and CpuThrottle.observe(record)
        during = cpu_rate(busy.pid)
        assert during <= 0.3, during
        code = ("import json, sys; from chaoskit.injectors.cpu.fault import CpuThrottle; "
                "r = CpuThrottle.from_ledger(json.loads(sys.argv[1])); CpuThrottle.revert(r); "
                "print(CpuThrottle.observe(r))")
        out = subprocess.run([sys.executable, "-c", code, json.dumps(record.to_json())], capture_output=True, text=True,
                             cwd=ROOT, timeout=30)
        assert out.returncode == 0 and out.stdout.strip() == "False", out.stderr
        assert not cg.exists() and cgroup_in(hier, busy.pid) == test_cgroups[0]
        after = best_rate(busy.pid)
        assert after > 0.6, after
    finally:
        CpuThrottle.revert(record)


def test_revert_from_the_prepare_record_and_when_the_target_is_gone(hier, test_cgroups, busy):
    home = test_cgroups[0]
    IoHierarchy.move(busy.pid, home)
    inj = throttle(pid=busy.pid, cpu=0.5)
    prepared = inj.prepare()
    CpuThrottle.revert(prepared)  # nothing applied yet: nothing to do
    assert cgroup_in(hier, busy.pid) == home
    inj.apply(prepared)
    assert cgroup_in(hier, busy.pid) == prepared.path
    CpuThrottle.revert(prepared)  # the ledger holds only the intent when apply dies before returning
    assert cgroup_in(hier, busy.pid) == home and not prepared.path.exists()

    record = throttle(pid=busy.pid, cpu=0.5)
    record = record.apply(record.prepare())
    busy.kill()
    busy.wait()
    CpuThrottle.revert(record)  # the target is gone: success
    assert not record.path.exists()


def test_throttle_preflight_refuses_init_and_own_tree(hier):
    with pytest.raises(PreflightError, match="refusing to throttle PID 1"):
        throttle(pid=1, cpu=0.5).preflight()
    with pytest.raises(PreflightError, match=f"refusing to throttle PID {os.getpid()}"):
        throttle(pid=os.getpid(), cpu=0.5).preflight()
    with pytest.raises(PreflightError, match="no running process matches name /\\^no-such-proc-xyz\\$/"):
        throttle(name="^no-such-proc-xyz$", cpu=0.5).preflight()
    with pytest.raises(PreflightError, match="child_of: no running process with PID"):
        throttle(child_of=4_000_000, cpu=0.5).preflight()


# ---------------------------------------------------------------- child_of

@pytest.fixture
def tree(tmp_path: Path) -> Iterator[dict[str, int]]:
    """parent (sh) -> child (sh) -> grandchild 'ckgrandkid', plus an unrelated 'ckgrandkid' the test starts."""
    exe = tmp_path / "ckgrandkid"
    exe.write_bytes(Path("/bin/sleep").read_bytes())
    exe.chmod(0o755)
    parent = subprocess.Popen(["sh", "-c", f"sh -c '{exe} 600 & wait' & wait"], start_new_session=True)
    unrelated = subprocess.Popen([str(exe), "600"])

    def grandkids() -> list[int]:
        out = subprocess.run(["pgrep", "-s", str(parent.pid), "-x", "ckgrandkid"], capture_output=True, text=True)
        return [int(x) for x in out.stdout.split()]

    wait_for(lambda: len(grandkids()) == 1, 5)
    grandkid = grandkids()[0]
    child = int(Path(f"/proc/{grandkid}/stat").read_text().rpartition(")")[2].split()[1])
    yield {"parent": parent.pid, "child": child, "grandchild": grandkid, "unrelated": unrelated.pid}
    os.killpg(parent.pid, signal.SIGKILL)
    parent.wait()
    unrelated.kill()
    unrelated.wait()


def test_child_of_selects_the_grandchild_by_name_not_an_unrelated_process(tree):
    assert tree["child"] != tree["parent"]
    spec = ProcessSignalSpec(type="process.signal", child_of=tree["parent"], name="^ckgrandkid$")
    inj = ProcessSignal(spec)
    inj.preflight()
    assert [r.pid for r in inj._targets()] == [tree["grandchild"]]
    everyone = ProcessSignal(ProcessSignalSpec(type="process.signal", child_of=tree["parent"]))._targets()
    assert sorted(r.pid for r in everyone) == sorted([tree["child"], tree["grandchild"]])
    record = inj.apply(inj.prepare())
    try:
        assert proc_state(tree["grandchild"]) == "T" and ProcessSignal.observe(record)
        assert proc_state(tree["unrelated"]) != "T" and proc_state(tree["child"]) != "T"
    finally:
        ProcessSignal.revert(record)
    assert proc_state(tree["grandchild"]) != "T"
    by_name = ProcessSignal(ProcessSignalSpec(type="process.signal", name="^ckgrandkid$"))._targets()
    assert {tree["grandchild"], tree["unrelated"]} <= {r.pid for r in by_name}  # name alone: both


def test_cpu_throttle_child_of(hier, tree):
    inj = throttle(child_of=tree["parent"], name="ckgrand", cpu=0.1)
    inj.preflight()
    assert "ckgrandkid" in inj.plan()[1]
    record = inj.prepare()
    assert [p.pid for p in record.procs] == [tree["grandchild"]]
    try:
        inj.apply(record)
        cg = record.path
        assert cgroup_in(hier, tree["grandchild"]) == cg
        assert cgroup_in(hier, tree["unrelated"]) != cg and cgroup_in(hier, tree["child"]) != cg
    finally:
        CpuThrottle.revert(record)
    assert not record.path.exists()


# ---------------------------------------------------------------- host.cpu_stress

def stress(**kw) -> CpuStress:
    inj = CpuStress(CpuStressSpec(type="host.cpu_stress", **kw))
    inj.ctx.lifetime_s = 60
    return inj


def test_cpu_stress_workers_use_cpu_and_revert_leaves_none(hier, test_cgroups):
    inj = stress(workers=2)
    inj.preflight()
    assert "2 busy worker" in inj.plan()[0]
    record = inj.apply(inj.prepare())
    holder, workers = record.holder, record.worker_procs
    try:
        assert len(workers) == 2 and CpuStress.observe(record)
        for w in workers:  # measured in the heavier-weighted test cgroup: the shared box's other load matters less
            IoHierarchy.move(w.pid, test_cgroups[0])
        t0, a = time.monotonic(), {w.pid: cpu_seconds(w.pid) for w in workers}
        time.sleep(1.5)
        used = {w.pid: (cpu_seconds(w.pid) - a[w.pid]) / (time.monotonic() - t0) for w in workers}
        print(f"\ncpu_stress workers=2 load=1.0 used {sum(used.values()):.2f} CPUs: {used}")
        assert all(u > 0.4 for u in used.values()) and sum(used.values()) > 1.0, used
    finally:
        CpuStress.revert(record)
    assert not any(is_alive(r) for r in [holder, *workers])
    assert not CpuStress.observe(record)
    CpuStress.revert(record)  # twice is fine


def test_cpu_stress_load_share_and_deadline(hier, test_cgroups):
    inj = stress(workers=1, load="30%")
    inj.ctx.lifetime_s = 8  # room for a slow start on a busy machine before the 1.5 s measurement
    record = inj.apply(inj.prepare())
    worker = record.worker_procs[0]
    try:
        IoHierarchy.move(worker.pid, test_cgroups[0])
        used = cpu_rate(worker.pid, 1.5)
        print(f"\ncpu_stress load=30%: the worker used {used:.2f} CPU")
        assert 0.15 < used < 0.45, f"load 30% used {used:.2f} CPU"
        wait_for(lambda: not CpuStress.observe(record) and not is_alive(worker), 10)  # exits by itself
    finally:
        CpuStress.revert(record)


def test_cpu_stress_dies_with_chaoskit(tmp_path):
    code = ("import json, time; from chaoskit.injectors.cpu.fault import CpuStress, CpuStressSpec\n"
            "inj = CpuStress(CpuStressSpec(type='host.cpu_stress', workers=1, nice=10)); inj.ctx.lifetime_s = 60\n"
            "print(json.dumps(inj.apply(inj.prepare()).to_json()), flush=True); time.sleep(60)\n")
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, cwd=ROOT)
    record = CpuStress.from_ledger(json.loads(proc.stdout.readline()))  # type: ignore[union-attr]
    refs = [p for p in [record.holder, *record.worker_procs] if p is not None]
    try:
        assert all(is_alive(r) for r in refs)
        assert os.getpriority(os.PRIO_PROCESS, refs[1].pid) == 10
        proc.kill()
        proc.wait()
        wait_for(lambda: not any(is_alive(r) for r in refs), 5)
    finally:
        CpuStress.revert(record)
        proc.kill()
        proc.wait()


def test_cpu_stress_preflight_bounds_workers():
    n = len(os.sched_getaffinity(0))
    with pytest.raises(PreflightError, match="more than 4 per CPU"):
        stress(workers=4 * n + 1).preflight()
    stress(workers=4 * n).preflight()
