"""The registry of reference deployments (chaoskit.targets.ref_registry): where commands told no --dir look, what
they find, what is pruned, and what they say when they find none or several. Deployments here are records over
this test's own `sleep` processes, not real servers."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from chaoskit.errors import ChaoskitError, PreflightError
from chaoskit.targets import ref_registry as rr
from chaoskit.targets.facts import reference_facts, reference_running
from chaoskit.targets.process import ProcessRef, proc_ref


@pytest.fixture
def env(tmp_path, monkeypatch) -> Path:
    """A state directory of its own, no $CHAOSKIT_REF_DIR, and a working directory with no .chaoskit/ref."""
    monkeypatch.setenv("CHAOSKIT_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.delenv("CHAOSKIT_REF_DIR", raising=False)
    (tmp_path / "cwd").mkdir()
    monkeypatch.chdir(tmp_path / "cwd")
    monkeypatch.setattr(rr, "NETNS_ROOT", tmp_path / "netns")
    return tmp_path


@pytest.fixture
def sleeper():
    procs: list[subprocess.Popen] = []

    def start() -> ProcessRef:
        p = subprocess.Popen(["sleep", "60"], start_new_session=True)
        procs.append(p)
        ref = proc_ref(p.pid)
        assert ref is not None
        return ref

    yield start
    for p in procs:
        p.kill()
        p.wait()


def deployment(root: Path, procs: list[ProcessRef], facts: dict | None = None, netns: list[str] | None = None) -> Path:
    """The records `ref up` writes in a deployment's directory."""
    root.mkdir(parents=True, exist_ok=True)
    (root / rr.PROCESSES).write_text(json.dumps([{"name": f"p{i}", **r.to_json(), "log": ""}
                                                 for i, r in enumerate(procs)]))
    if facts is not None:
        (root / rr.FACTS).write_text(json.dumps(facts))
    if netns is not None:
        (root / rr.NETNS).write_text(json.dumps(netns))
    return root


def gone() -> ProcessRef:
    """A process that is not there: one that has exited (its pid, another start time)."""
    p = subprocess.Popen(["true"])
    p.wait()
    return ProcessRef(p.pid, 1)


def registered_by_someone_gone(root: Path, engine: str = "triton") -> Path:
    """An entry as a `ref up` that has exited wrote it (its start time does not match any live process)."""
    path = rr.register(root, engine)
    entry = json.loads(path.read_text())
    entry["started_by"]["start_time"] += 1
    path.write_text(json.dumps(entry))
    return path


def test_an_entry_is_a_typed_record_of_the_dir_engine_and_ref_up_process(env):
    path = rr.register(env / "d", "vllm")
    assert path.parent == env / "state" / "references"
    entry = rr.Entry.model_validate_json(path.read_text())
    me = proc_ref(os.getpid())
    assert entry.dir == str((env / "d").resolve()) and entry.engine == "vllm"
    assert entry.started_by.ref() == me
    rr.unregister(env / "d")
    assert not path.exists()


def test_a_deployment_started_elsewhere_is_found_through_the_registry(env, sleeper):
    facts = {"engine": "triton", "url": "http://127.0.0.1:9", "replica_pid": 1}
    root = deployment(env / "elsewhere" / "ref", [sleeper()], facts)
    registered_by_someone_gone(root)
    found = rr.search()
    one = found.one("status")
    assert one is not None and one.dir == root.resolve() and one.state is rr.State.RUNNING
    assert one.source == "the registry" and one.engine == "triton" and not found.named
    assert reference_facts("triton") == facts and reference_running()
    assert rr.every_dir() == [(env / "cwd" / ".chaoskit" / "ref").resolve(), root.resolve()]


def test_an_entry_whose_deployment_is_gone_is_pruned_and_said(env, sleeper):
    path = registered_by_someone_gone(deployment(env / "gone", [gone()], {"engine": "triton"}))
    found = rr.search()
    assert found.found == () and found.one("down") is None and not path.exists()
    assert f"removed 1 whose deployment is gone: {(env / 'gone').resolve()}" in found.where()
    with pytest.raises(PreflightError) as e:
        reference_facts("triton")
    text = str(e.value)
    assert "the reference deployment is not running: none found; looked in:" in text
    assert f"the working directory's .chaoskit/ref ({env / 'cwd' / '.chaoskit' / 'ref'}): nothing recorded" in text
    assert f"the registry of deployments `chaoskit ref up` started ({env / 'state' / 'references'})" in text
    assert "chaoskit ref up --engine triton" in text and not reference_running()


def test_kept_while_its_ref_up_runs_while_processes_live_and_while_namespaces_are_left(env, sleeper):
    starting = env / "starting"
    rr.register(starting, "triton")  # by this (live) process, nothing spawned yet
    unfinished = registered_by_someone_gone(deployment(env / "unfinished", [sleeper()]))  # no facts: `up` killed
    (env / "netns" / "ckrefab-0").mkdir(parents=True)
    leftover = registered_by_someone_gone(deployment(env / "leftover", [gone()], netns=["ckrefab-0"]))
    states = {f.dir.name: f.state for f in rr.search().found}
    assert states == {"starting": rr.State.STARTING, "unfinished": rr.State.UNFINISHED,
                      "leftover": rr.State.LEFTOVER}
    assert unfinished.exists() and leftover.exists()
    with pytest.raises(PreflightError, match="none found") as e:  # none of them has facts to give
        reference_facts("triton")
    assert f"({(env / 'unfinished').resolve()}: unfinished; `chaoskit ref status --dir " in str(e.value)


def test_several_found_is_an_error_naming_each_with_its_dir(env, sleeper):
    a = deployment(env / "a", [sleeper()], {"engine": "triton"})
    b = deployment(env / "b b", [sleeper()], {"engine": "vllm"})
    registered_by_someone_gone(a)
    registered_by_someone_gone(b, "vllm")
    with pytest.raises(ChaoskitError) as e:
        rr.search().one("down")
    text = str(e.value)
    assert text.startswith("2 reference deployments found; name one with --dir:")
    assert f"chaoskit ref down --dir {a.resolve()}   # triton, running" in text
    assert f"chaoskit ref down --dir '{b.resolve()}'   # vllm, running" in text
    with pytest.raises(PreflightError, match="2 reference deployments are running") as e:
        reference_facts("triton")
    assert f"CHAOSKIT_REF_DIR={a.resolve()}" in str(e.value)


def test_a_named_dir_is_the_only_place_looked(env, sleeper, monkeypatch):
    registered_by_someone_gone(deployment(env / "registered", [sleeper()], {"engine": "triton"}))
    monkeypatch.setenv("CHAOSKIT_REF_DIR", str(env / "empty"))
    found = rr.search()
    assert found.named and [f.dir for f in found.found] == [(env / "empty").resolve()]
    assert found.looked == (f"$CHAOSKIT_REF_DIR {(env / 'empty').resolve()}: nothing recorded (the registry is "
                            "not read while it is set)",)
    with pytest.raises(PreflightError, match=r"not running \(no .*empty/facts.json\)"):
        reference_facts("triton")
    by_option = rr.search(env / "registered")
    assert by_option.named and by_option.looked[0].startswith(f"--dir {(env / 'registered').resolve()}: running")
    assert rr.every_dir() == [(env / "empty").resolve()]


def test_the_working_directorys_deployment_comes_before_the_registry(env, sleeper):
    registered_by_someone_gone(deployment(env / "registered", [sleeper()], {"engine": "vllm"}))
    here = deployment(env / "cwd" / ".chaoskit" / "ref", [sleeper()], {"engine": "triton"})
    one = rr.search().one("status")
    assert one is not None and one.dir == here.resolve() and one.source == "the working directory's .chaoskit/ref"
    assert reference_facts("triton")["engine"] == "triton"


def test_an_unreadable_entry_is_skipped_and_named_not_removed(env):
    bad = env / "state" / "references" / "0123.json"
    bad.parent.mkdir(parents=True)
    bad.write_text('{"dir": "/x"}')
    found = rr.search()
    assert found.found == () and bad.exists()
    assert "skipped unreadable entries: 0123.json (" in found.where()


def test_hints_name_the_dir_unless_it_is_the_default(env, monkeypatch):
    assert rr.command("down", Path(".chaoskit/ref")) == "chaoskit ref down"
    assert rr.command("down", env / "x y") == f"chaoskit ref down --dir '{env / 'x y'}'"
    monkeypatch.setenv("CHAOSKIT_REF_DIR", str(env / "x"))
    assert rr.command("status", env / "x") == "chaoskit ref status"
    assert rr.command("status", env / "x", named=True) == f"chaoskit ref status --dir {env / 'x'}"
