"""process.memory_limit on real cgroups and the test's own child processes: a child that allocates past the limit
is OOM-killed by the kernel and reported as a kill; with headroom and a holder it survives until it needs more
than the holder left; revert moves survivors (each thread, and a child forked meanwhile) back and removes the
cgroup, also twice, from the prepare record, and from the record alone in a fresh process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from pydantic import ValidationError

from chaoskit.errors import PreflightError
from chaoskit.experiment.schema import experiment_schema
from chaoskit.injectors import INJECTORS
from chaoskit.injectors.memory.limit import MemoryLimit, MemoryLimitSpec
from chaoskit.targets.cgroups import IoHierarchy, MemHierarchy, find_mem_hierarchy
from chaoskit.targets.process import find_by_token, is_alive
from tests.conftest import ROOT, wait_for
from tests.helpers import cgroup_check

MiB = 1 << 20
# Allocates and touches N MiB per line read ("ok" when resident); a second, sleeping thread; on "fork" forks a
# sleeping child and prints its PID.
ALLOC = """
import mmap, os, sys, threading, time
threading.Thread(target=time.sleep, args=(600,), daemon=True).start()
held = []
print("ready", flush=True)
for line in sys.stdin:
    if line.strip() == "fork":
        pid = os.fork()
        if pid == 0:
            time.sleep(600); os._exit(0)
        print(pid, flush=True)
        continue
    m = mmap.mmap(-1, int(line) << 20)
    for off in range(0, len(m), 4096):
        m[off] = 1
    held.append(m)
    print("ok", flush=True)
"""


def spec(**kw) -> MemoryLimitSpec:
    return MemoryLimitSpec(type="process.memory_limit", **kw)


def limiter(**kw) -> MemoryLimit:
    inj = MemoryLimit(spec(**kw))
    inj.ctx.lifetime_s = 120
    return inj


# ---------------------------------------------------------------- the spec (no cgroups needed)

@pytest.mark.parametrize("fields, message", [
    ({"pid": 1}, "give exactly one of limit"),
    ({"pid": 1, "limit": "64MiB", "headroom": "8MiB"}, "give exactly one of limit"),
    ({"pid": 1, "headroom": "32MiB", "pressure": "32MiB"}, "pressure (32.0MiB) must be less than headroom"),
    ({"pid": 1, "limit": "32MiB", "pressure": "64MiB"}, "must be less than limit"),
    ({"name": "x", "descendants": True, "limit": "64MiB"}, "descendants goes with pid"),
    ({"pid": 1, "limit": "10%"}, "a percentage has nothing to be of here"),
    ({"pid": 1, "child_of": 2, "limit": "64MiB"}, "give exactly one target"),
])
def test_spec_refuses(fields, message):
    with pytest.raises(ValidationError, match=message.replace("(", r"\(").replace(")", r"\)")):
        spec(**fields)


def test_spec_sizes_registration_and_schema():
    s = spec(pid=[10, 11], headroom="64MiB", pressure="48M")
    assert (s.headroom, s.pressure, s.limit) == (64 * MiB, 48_000_000, None)
    assert spec(pid=1, limit=300 * MiB).limit == 300 * MiB
    assert MemoryLimit in INJECTORS
    props = experiment_schema()["$defs"]["MemoryLimitSpec"]["properties"]
    missing = [k for k, v in props.items() if k != "type" and not v.get("description")]
    assert not missing, f"fields without a description: {missing}"


def _mountinfo(tmp_path: Path, lines: list[str]) -> Path:
    f = tmp_path / "mountinfo"
    f.write_text("".join(f"{i} 1 0:{i} / {line}\n" for i, line in enumerate(lines, 30)))
    return f


def test_find_mem_hierarchy_prefers_v2_and_says_when_there_is_none(tmp_path: Path):
    v2 = tmp_path / "unified"
    v2.mkdir()
    (v2 / "cgroup.controllers").write_text("cpu io memory pids\n")
    both = _mountinfo(tmp_path, [f"{v2} rw - cgroup2 cgroup2 rw",
                                 "/sys/fs/cgroup/memory rw - cgroup cgroup rw,memory"])
    assert find_mem_hierarchy(both) == MemHierarchy(2, v2)
    (v2 / "cgroup.controllers").write_text("cpu io pids\n")
    assert find_mem_hierarchy(both) == MemHierarchy(1, Path("/sys/fs/cgroup/memory"))
    none = _mountinfo(tmp_path, [f"{v2} rw - cgroup2 cgroup2 rw", "/sys/fs/cgroup/cpu rw - cgroup cgroup rw,cpu"])
    with pytest.raises(PreflightError, match="^memory limits need the cgroup v2 memory controller or a v1 memory "
                                             "hierarchy; neither is mounted here"):
        find_mem_hierarchy(none)


def test_preflight_needs_root(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    with pytest.raises(PreflightError, match=r"^process.memory_limit: needs root \(it creates a memory cgroup"):
        limiter(pid=os.getpid(), limit="64MiB").preflight()


# ---------------------------------------------------------------- real cgroups

@pytest.fixture
def hier() -> MemHierarchy:
    """Skipped only where /proc/mounts shows no hierarchy with memory (chaoskit's finder must find the one there
    is)."""
    return cgroup_check.hierarchy_or_skip(find_mem_hierarchy, "memory", "memory")


@pytest.fixture
def home(hier: MemHierarchy) -> Iterator[Path]:
    """A throwaway memory cgroup (cktest-*, not chaoskit-*) the targets start in; emptied and removed at the end."""
    cg = hier.root / f"cktest-mem-{uuid.uuid4().hex[:8]}"
    cg.mkdir()
    yield cg
    for pid in IoHierarchy.procs(cg):
        try:
            IoHierarchy.move(pid, hier.root)
        except OSError:
            pass
    deadline = time.monotonic() + 10
    while True:
        try:
            cg.rmdir()
            break
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


class Child:
    """A python child of the test that allocates on request."""

    def __init__(self, cgroup: Path):
        self.proc = subprocess.Popen([sys.executable, "-c", ALLOC], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     text=True)
        assert self.readline() == "ready"
        IoHierarchy.move(self.proc.pid, cgroup)
        wait_for(lambda: len(os.listdir(f"/proc/{self.proc.pid}/task")) == 2, 3)
        self.pid = self.proc.pid

    def readline(self) -> str:
        assert self.proc.stdout is not None
        return self.proc.stdout.readline().strip()

    def send(self, line: str) -> str:
        assert self.proc.stdin is not None
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()
        return self.readline()

    def allocate(self, mib: int) -> bool:
        """True if the MiB became resident; False if the child died on the way (read EOF)."""
        try:
            return self.send(str(mib)) == "ok"
        except BrokenPipeError:
            return False

    def close(self) -> None:
        self.proc.kill()
        self.proc.wait()


@pytest.fixture
def children(home: Path) -> Iterator[list[Child]]:
    made: list[Child] = []
    yield made
    for c in made:
        c.close()


def may_set_oom_score_adj(value: int) -> bool:
    """Whether a process started here may write `value` to its oom_score_adj (the kernel decides, not chaoskit;
    below oom_score_adj_min it takes CAP_SYS_RESOURCE)."""
    code = f"import os; os.write(os.open('/proc/self/oom_score_adj', os.O_WRONLY), b'{value}')"  # unbuffered
    return subprocess.run([sys.executable, "-c", code], capture_output=True).returncode == 0


def test_allocating_past_the_limit_gets_the_child_oom_killed(hier, home, children):
    children.append(victim := Child(home))
    inj = limiter(pid=victim.pid, limit="48MiB")
    inj.preflight()
    plan = inj.plan()
    record = inj.apply(inj.prepare())
    cg = record.path
    try:
        assert cg.name.startswith("chaoskit-") and str(cg) in plan[0] and "limit 48.0MiB" in plan[0]
        assert hier.read_limit(cg) == 48 * MiB == record.limit_bytes and MemoryLimit.observe(record)
        assert hier.cgroup_of(victim.pid) == cg
        assert not victim.allocate(96)  # more than the limit: the kernel's OOM killer ends it
        assert victim.proc.wait(timeout=30) == -9
        details = MemoryLimit.observe_details(record)
        print(f"\nmemory_limit 48MiB, child allocating 96MiB: {details}")
        assert (details["oom_kills"] or 0) >= 1 or (hier.version == 1 and "oom_kill" not in details["events"])
        assert details["gone"] == [f"{victim.pid} python"] and details["survivors"] == []
        assert not details["in_effect"]
    finally:
        MemoryLimit.revert(record)  # the target was OOM-killed: success
    assert not cg.exists()


def test_an_existing_cgroup_gets_its_own_limit_and_has_its_previous_limits_restored(hier, home, children):
    """`cgroup:` (what a pod's container becomes on its node): the limit goes on that cgroup, nothing is moved,
    an allocation past it is OOM-killed there, and revert writes back the limit files as they were (here a
    256MiB limit set beforehand, not "unlimited")."""
    hier.write_limit(home, 256 * MiB)
    before = hier.limit_files(home)
    children.append(victim := Child(home))
    inj = limiter(cgroup=home.name, headroom="32MiB")
    inj.preflight()
    plan = inj.plan()
    assert str(home) in plan[0] and "nothing is moved" in plan[0] and str(256 * MiB) in plan[-1]
    record = inj.apply(inj.prepare())
    try:
        assert (record.cgroup, record.dedicated, record.previous) == (str(home), False, before)
        assert hier.read_limit(home) == record.limit_bytes == record.usage_at_move + 32 * MiB
        assert MemoryLimit.observe(record) and hier.cgroup_of(victim.pid) == home
        assert not victim.allocate(64)  # more than the headroom: OOM-killed in its own cgroup
        assert victim.proc.wait(timeout=30) == -9
    finally:
        MemoryLimit.revert(record)
    assert hier.limit_files(home) == before and home.is_dir() and not MemoryLimit.observe(record)
    MemoryLimit.revert(record)  # twice is fine
    assert hier.limit_files(home) == before


def test_headroom_survives_until_it_needs_what_the_holder_took(hier, home, children):
    children.append(victim := Child(home))
    children.append(bystander := Child(home))
    assert victim.allocate(40)  # before the limit: in its RSS, so the OOM killer prefers it to a small holder
    inj = limiter(pid=[victim.pid, bystander.pid], headroom="48MiB", pressure="16MiB")
    record = inj.apply(inj.prepare())
    cg = record.path
    holder = record.holder
    try:
        assert record.limit_bytes == record.usage_at_move + 48 * MiB == hier.read_limit(cg)
        assert hier.cgroup_of(holder.pid) == cg and is_alive(holder)
        adj = int(Path(f"/proc/{holder.pid}/oom_score_adj").read_text())
        # -1000 where this host lets a process started here ask for it (the kernel decides: CAP_SYS_RESOURCE, which
        # this container lacks), tried by a child of the test; else the kernel refused the holder and it kept what it
        # inherited from this process (helper_proc.spawn)
        protectable = may_set_oom_score_adj(-1000)
        inherited = int(Path("/proc/self/oom_score_adj").read_text())
        assert record.holder_oom_score_adj == adj == (-1000 if protectable else inherited), (adj, inherited)
        assert (hier.usage(cg) or 0) >= 16 * MiB  # the holder's pages are charged to the limited cgroup
        assert victim.allocate(8)  # within what the holder left
        assert MemoryLimit.observe(record) and MemoryLimit.observe_details(record)["oom_kills"] in (0, None)
        assert not victim.allocate(64)  # past it: OOM-killed, and the holder is not the one picked
        assert victim.proc.wait(timeout=30) == -9
        details = MemoryLimit.observe_details(record)
        print(f"\nheadroom 48MiB, pressure 16MiB (holder oom_score_adj {adj}): {details}")
        assert details["holder_alive"] and is_alive(holder)
        assert details["gone"] == [f"{victim.pid} python"] and details["survivors"] == [f"{bystander.pid} python"]
        assert MemoryLimit.observe(record)  # the bystander is still limited
    finally:
        MemoryLimit.revert(record)
    assert not cg.exists() and not is_alive(holder) and not find_by_token(record.token)
    assert hier.cgroup_of(bystander.pid) == home


def test_revert_moves_every_thread_and_a_forked_child_back(hier, home, children):
    children.append(target := Child(home))
    main_tid, side_tid = sorted(int(t) for t in os.listdir(f"/proc/{target.pid}/task"))
    side_home = home.parent / f"{home.name}-side"
    side_home.mkdir()
    try:
        if hier.version == 1:  # v1 lets threads of one process sit in different cgroups: each must come back home
            hier.move_task(target.pid, side_tid, side_home)
        else:
            side_home = home
        inj = limiter(pid=target.pid, headroom="64MiB")
        record = inj.prepare()
        assert {t.tid: t.from_ for t in record.procs[0].threads} == {main_tid: str(home), side_tid: str(side_home)}
        record = inj.apply(record)
        cg = record.path
        try:
            assert all(hier.cgroup_of(target.pid, t) == cg for t in (main_tid, side_tid))
            forked = int(target.send("fork"))
            assert hier.cgroup_of(forked) == cg
        finally:
            MemoryLimit.revert(record)
        try:
            assert not cg.exists() and not MemoryLimit.observe(record)
            assert hier.cgroup_of(target.pid, main_tid) == home and hier.cgroup_of(target.pid, side_tid) == side_home
            assert hier.cgroup_of(forked) == home  # where its parent came from
            MemoryLimit.revert(record)  # twice is fine
        finally:
            os.kill(forked, 9)
    finally:
        for pid in IoHierarchy.procs(side_home) if side_home != home else []:
            IoHierarchy.move(pid, home)
        if side_home != home:
            wait_for(lambda: not IoHierarchy.procs(side_home), 3)
            side_home.rmdir()


def test_revert_from_the_record_alone_in_a_fresh_process(hier, home, children):
    children.append(target := Child(home))
    inj = limiter(pid=target.pid, headroom="64MiB", pressure="8MiB")
    record = inj.apply(inj.prepare())
    cg = record.path
    try:
        assert MemoryLimit.observe(record) and is_alive(record.holder)
        code = ("import json, sys; from chaoskit.injectors.memory.limit import MemoryLimit; "
                "r = MemoryLimit.from_ledger(json.loads(sys.argv[1])); MemoryLimit.revert(r); "
                "print(MemoryLimit.observe(r))")
        out = subprocess.run([sys.executable, "-c", code, json.dumps(record.to_json())], capture_output=True, text=True,
                             cwd=ROOT, timeout=60)
        assert out.returncode == 0 and out.stdout.strip() == "False", out.stderr
        assert not cg.exists() and hier.cgroup_of(target.pid) == home
        assert not find_by_token(record.token)
        assert target.allocate(96)  # no limit any more
    finally:
        MemoryLimit.revert(record)


def test_revert_from_the_prepare_record_and_a_failed_apply(hier, home, children, monkeypatch):
    children.append(target := Child(home))
    inj = limiter(pid=target.pid, limit="64MiB")
    prepared = inj.prepare()
    MemoryLimit.revert(prepared)  # nothing applied yet: nothing to do
    assert hier.cgroup_of(target.pid) == home
    inj.apply(prepared)
    assert hier.cgroup_of(target.pid) == prepared.path
    MemoryLimit.revert(prepared)  # the ledger holds only the intent when apply dies before returning
    assert hier.cgroup_of(target.pid) == home and not prepared.path.exists()

    # pressure that cannot fit what is left under an absolute limit: apply refuses and undoes what it did
    monkeypatch.setattr(MemHierarchy, "usage", lambda self, cg: 60 * MiB)
    failing = limiter(pid=target.pid, limit="64MiB", pressure="8MiB")
    record = failing.prepare()
    with pytest.raises(RuntimeError, match=r"pressure 8.0MiB does not fit the 4.0MiB left under the limit 64.0MiB"):
        failing.apply(record)
    assert hier.cgroup_of(target.pid) == home and not record.path.exists()
    assert not find_by_token(record.token)


def test_preflight_refuses_init_own_tree_and_missing_targets(hier):
    with pytest.raises(PreflightError, match="refusing to limit PID 1"):
        limiter(pid=1, limit="64MiB").preflight()
    with pytest.raises(PreflightError, match=f"refusing to limit PID {os.getpid()}"):
        limiter(pid=os.getpid(), limit="64MiB").preflight()
    with pytest.raises(PreflightError, match="no running process matches name /\\^no-such-proc-xyz\\$/"):
        limiter(name="^no-such-proc-xyz$", limit="64MiB").preflight()
    with pytest.raises(PreflightError, match="child_of: no running process with PID"):
        limiter(child_of=4_000_000, limit="64MiB").preflight()


def test_descendants_selects_the_whole_tree(hier, tmp_path):
    parent = subprocess.Popen(["sh", "-c", "sleep 600 & sleep 600 & wait"], start_new_session=True)
    try:
        wait_for(lambda: len(subprocess.run(["pgrep", "-P", str(parent.pid)], capture_output=True,
                                            text=True).stdout.split()) == 2, 5)
        procs = limiter(pid=parent.pid, descendants=True, limit="64MiB").target().procs
        assert procs[0]["pid"] == parent.pid and sorted(p["comm"] for p in procs[1:]) == ["sleep", "sleep"]
        assert [p["pid"] for p in limiter(pid=parent.pid, limit="64MiB").target().procs] == [parent.pid]
    finally:
        os.killpg(parent.pid, 9)
        parent.wait()
