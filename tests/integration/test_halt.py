"""`chaoskit halt`: two runs on this host (SIGSTOP of a sleeper) and one on a Kubernetes pod through a helper pod
(FakeKubeApi; its FAKE kubelet runs the real agent on this host against a stand-in container), started from
another state directory so that only the cluster's lever can reach it, are all aborted (exit 3, `halted: WHY`)
and rolled back within 2 s of `chaoskit halt --cluster`; `chaoskit status` lists them while they run; new runs
are refused (exit 4, naming who, when and why) until `chaoskit halt --release --cluster`."""

from __future__ import annotations

import json
import socket
import subprocess
import time
from pathlib import Path

import pytest

from tests.conftest import chaoskit, ledgers, proc_state, wait_for, write
from tests.helpers import standin_container
from tests.helpers.fake_kube import FakeKubeApi, run_pod_here

LOCAL = """\
apiVersion: chaoskit/v1
kind: Experiment
metadata: {name: NAME}
steadyState:
  probes: [{name: t, type: command, argv: ["true"]}]
  during: {every: 0.5s}
method:
  - inject: {type: process.signal, pid: "{pid}", signal: SIGSTOP}
    duration: DURATION
"""
KUBE = """\
apiVersion: chaoskit/v1
kind: Experiment
metadata: {name: halt-kube}
steadyState:
  probes: [{name: t, type: command, argv: ["true"]}]
  during: {every: 0.5s}
method:
  - inject:
      type: process.signal
      kubernetes: {namespace: prod, selector: {app: web}, mode: all}
      signal: SIGSTOP
    duration: 30s
"""
HALT_WITHIN_S = 2.0

pytestmark = pytest.mark.usefixtures("no_kube_env")


def local_experiment(tmp_path: Path, name: str, duration: str = "30s") -> Path:
    return write(tmp_path / f"{name}.yaml", LOCAL.replace("NAME", name).replace("DURATION", duration))


def journal(out_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (out_dir / "journal.jsonl").read_text().splitlines()]


def applied(out_dir: Path) -> bool:
    path = out_dir / "journal.jsonl"
    return path.exists() and '"fault_applied"' in path.read_text()


def finish(run: subprocess.Popen) -> tuple[int, str]:
    out, err = run.communicate(timeout=60)
    return run.returncode, out + err


@pytest.fixture
def web_pod(tmp_path):
    """FakeKubeApi with pod prod/web-0 on node-a whose container is a stand-in (its processes on this host); the
    helper pods asked for run on this host. Yields (api, the stand-in, the kubeconfig's path)."""
    container = standin_container.start(None, standin_container.hierarchy_or_skip())
    try:
        wait_for(lambda: len(container.pids()) == 2, timeout=10)
        with FakeKubeApi() as api:
            api.kubelet = run_pod_here
            api.add_pod("prod", "web-0", {"app": "web"}, node="node-a", container_ids=(container.container_id,))
            yield api, container, api.write_kubeconfig(tmp_path / "kubeconfig")
    finally:
        container.stop()


def test_halt_cluster_aborts_every_run_and_refuses_new_ones_until_released(tmp_path, web_pod, monkeypatch):
    api, container, kubeconfig = web_pod
    monkeypatch.setenv("KUBECONFIG", str(kubeconfig))
    here, elsewhere = tmp_path / "state", tmp_path / "state-of-another-host"
    sleepers = [subprocess.Popen(["sleep", "600"]) for _ in range(2)]
    runs: dict[str, tuple[subprocess.Popen, Path]] = {}
    try:
        for i, s in enumerate(sleepers):
            out = tmp_path / f"out-local-{i}"
            runs[f"local-{i}"] = (chaoskit("run", str(local_experiment(tmp_path, f"halt-local-{i}")), "--var",
                                           f"pid={s.pid}", "--plain", "--out", str(out), state=here), out)
        runs["kube"] = (chaoskit("run", str(write(tmp_path / "kube.yaml", KUBE)), "--plain", "--out",
                                 str(tmp_path / "out-kube"), state=elsewhere), tmp_path / "out-kube")
        wait_for(lambda: all(applied(out) or run.poll() is not None for run, out in runs.values()), timeout=60)
        assert all(run.poll() is None for run, _ in runs.values()), [finish(r) for r, _ in runs.values()]
        assert [proc_state(s.pid) for s in sleepers] == ["T", "T"]
        assert {proc_state(pid) for pid in container.pids()} == {"T"}

        listed = json.loads(chaoskit("status", "--cluster", "--json", state=here).communicate(timeout=30)[0])
        assert listed["halted"] == []
        assert sorted((r["experiment"], r["faults"], r["state"]) for r in listed["runs"]) == [
            ("halt-local-0", ["process.signal"], "running"), ("halt-local-1", ["process.signal"], "running")]
        (remote,) = listed["cluster_runs"]
        assert remote["experiment"] == "halt-kube" and remote["since"] > time.time() - 60
        assert remote["host"] == socket.gethostname()
        assert [(f["type"], f["node"], f["pod"], f["state"]) for f in remote["faults"]] == [
            ("process.signal", "node-a", "web-0", "applied")]

        t_halt = time.time()
        halt = chaoskit("halt", "--cluster", "--reason", "game day over", state=here)
        assert finish(halt)[0] == 0
        t_pulled = time.time()
        targets = {"local-0": [sleepers[0].pid], "local-1": [sleepers[1].pid], "kube": container.pids()}
        resumed: dict[str, float] = {}  # the seconds from t_pulled until each fault was seen gone

        def all_resumed() -> bool:
            for name, pids in targets.items():
                if name not in resumed and all(proc_state(pid) != "T" for pid in pids):
                    resumed[name] = round(time.time() - t_pulled, 2)
            return len(resumed) == len(targets)

        wait_for(all_resumed, timeout=30)
        ended = {name: finish(run) for name, (run, _) in runs.items()}
        t_ended = time.time()
        for name, (code, text) in ended.items():
            assert code == 3, (name, text)
            assert "aborted (exit 3)" in text and "halted: game day over" in text, text
        seen = {name: round(next(e["t"] for e in journal(out) if e["event"] == "safeguard") - t_pulled, 2)
                for name, (_, out) in runs.items()}
        journaled = {name: round(next(e["t"] for e in journal(out) if e["event"] == "fault_reverted") - t_pulled, 2)
                     for name, (_, out) in runs.items()}
        print(f"halt --cluster took {t_pulled - t_halt:.2f}s; after it returned: seen {seen}, fault gone {resumed}, "
              f"revert journaled {journaled}, every run ended {t_ended - t_pulled:.2f}s (add the command's own "
              "time for the seconds from its start)")
        assert max(resumed.values()) <= HALT_WITHIN_S, resumed
        for _, out in runs.values():
            events = journal(out)
            assert next(e for e in events if e["event"] == "safeguard")["probe"] == "halt"
            end = events[-1]
            assert (end["event"], end["verdict"], end["exit_code"], end["reason"]) == (
                "end", "aborted", 3, "halted: game day over")
        assert [proc_state(s.pid) for s in sleepers] == ["S", "S"]
        assert {proc_state(pid) for pid in container.pids()} == {"S"}
        assert ledgers(here) == ledgers(elsewhere) == []
        assert sorted(api.state.configmaps) == [("chaoskit", "chaoskit-halt")]  # the run's records are gone
        assert sorted(api.state.pods) == [("prod", "web-0")]  # and its helper pods

        refused = [chaoskit("run", str(local_experiment(tmp_path, "after")), "--var", f"pid={sleepers[0].pid}",
                            "--plain", "--out", str(tmp_path / "refused-here"), state=here),
                   chaoskit("run", str(tmp_path / "kube.yaml"), "--plain", "--out", str(tmp_path / "refused"),
                            state=elsewhere)]
        for run, where in zip(refused, ("on host", "in cluster"), strict=True):
            code, text = finish(run)
            assert code == 4, text
            assert f"chaoskit is halted {where}" in text and "by root@" in text, text
            assert "game day over; no run starts until it is released (chaoskit halt --release" in text, text
        assert proc_state(sleepers[0].pid) == "S" and ledgers(here) == []

        assert finish(chaoskit("halt", "--release", "--cluster", state=here))[0] == 0
        assert api.state.configmaps == {}
        again = chaoskit("run", str(local_experiment(tmp_path, "released", "0.2s")), "--var",
                         f"pid={sleepers[0].pid}", "--plain", "--out", str(tmp_path / "released"), state=here)
        code, text = finish(again)
        assert code == 0, text
    finally:
        for run, _ in runs.values():
            if run.poll() is None:
                run.kill()
        for s in sleepers:
            s.kill()
            s.wait()
