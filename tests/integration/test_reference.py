"""The reference deployment against the real servers: tritonserver (from the nvidia-pytriton wheel) running the
bundled tiny_lm repository, behind the gateway."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from chaoskit.reference.deploy import Deployment, RefOptions
from chaoskit.targets.process import cmdline, group_members, proc_state
from tests.conftest import ROOT, requires_triton, wait_for

pytestmark = requires_triton


def http(url: str, body: dict | None = None, timeout: float = 30) -> tuple[int, dict, bytes]:
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, method="POST" if data is not None else "GET")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, dict(r.headers), r.read()
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers), e.read()


def generate(base: str, text: str, max_tokens: int = 8, model: str = "tiny_lm") -> tuple[int, dict, bytes]:
    return http(f"{base}/v2/models/{model}/generate", {"text_input": text, "max_tokens": max_tokens})


def listening(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
        return True
    except OSError:
        return False


def start(tmp: Path, port: int, **kw) -> tuple[Deployment, dict]:
    d = Deployment(tmp)
    return d, d.up(RefOptions(port=port, **kw), say=lambda _m: None)


def assert_all_gone(d: Deployment, pids: list[int], ports: list[int]) -> None:
    for pid in pids:
        assert not group_members(pid), f"process group {pid} still has live processes"
    for port in ports:
        assert not listening(port), f"port {port} still listening"


@pytest.fixture(scope="module")
def ref(tmp_path_factory):
    d, facts = start(tmp_path_factory.mktemp("ref"), 18300)
    yield facts
    pids = [p["pid"] for p in d.processes()]
    d.down(say=lambda _m: None)
    assert_all_gone(d, pids, [18300 + k for k in range(7)])


def test_ready_through_gateway_and_config(ref):
    status, headers, _ = http(f"{ref['url']}/v2/models/tiny_lm/ready")
    assert status == 200 and float(headers["X-Model-Latency"]) >= 0
    _, _, body = http(f"{ref['url']}/v2/models/tiny_lm/config")
    cfg = json.loads(body)
    assert cfg["max_batch_size"] == 64 and cfg["backend"] == "python"
    assert "dynamic_batching" in cfg and cfg["dynamic_batching"]["preferred_batch_size"] == [8, 16, 32, 64]
    print(f"\nstartup {ref['startup_s']} s for 2 Triton replicas + gateway")


def test_x_model_latency_on_every_response(ref):
    for _ in range(10):
        status, headers, body = generate(ref["url"], "hello world")
        assert status == 200 and json.loads(body)["text_output"]
        assert float(headers["X-Model-Latency"]) > 0 and headers["X-Upstream-Replica"].startswith("triton-")
    status, headers, _ = http(f"{ref['url']}/v2/models/no_such_model/ready")
    assert status >= 400 and float(headers["X-Model-Latency"]) >= 0


def test_concurrent_requests_form_batches(ref):
    replica = ref["replicas"][0]["url"]

    def stats() -> tuple[int, int]:
        s = json.loads(http(f"{replica}/v2/models/tiny_lm/stats")[2])["model_stats"][0]
        return s["inference_count"], s["execution_count"]

    inf0, exe0 = stats()
    with ThreadPoolExecutor(48) as pool:
        codes = list(pool.map(lambda i: generate(replica, f"prompt {i}", 4)[0], range(48)))
    # Triton counts an execution after its responses are sent: the statistics can lag the last response
    deadline = time.monotonic() + 5
    while stats()[0] - inf0 < 48 and time.monotonic() < deadline:
        time.sleep(0.05)
    inf1, exe1 = stats()
    print(f"\n48 concurrent requests: {inf1 - inf0} inferences in {exe1 - exe0} executions")
    assert codes == [200] * 48 and inf1 - inf0 == 48 and exe1 - exe0 < 48


def test_streaming_through_gateway_token_by_token(ref):
    """Token events arrive as they are made, not in one buffer at the end: over the socket, the first event comes
    well before the last (a gateway that buffered the stream would deliver them together)."""
    tokens = 160
    body = json.dumps({"text_input": "stream me", "max_tokens": tokens}).encode()
    host, port = ref["url"].removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=30) as s:
        sent = time.monotonic()
        s.sendall(b"POST /v2/models/tiny_lm_stream/generate_stream HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
                  b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
        reads = []  # (arrival, bytes) of each socket read
        while chunk := s.recv(1 << 20):
            reads.append((time.monotonic(), chunk))
    head, _, stream = b"".join(c for _, c in reads).partition(b"\r\n\r\n")
    assert float(re.search(rb"(?i)x-model-latency: ([0-9.]+)", head).group(1)) >= 0
    events = [json.loads(line[6:]) for line in stream.split(b"\n") if line.startswith(b"data: ")]
    assert len(events) == tokens and all(len(e["text_output"]) == 1 for e in events)
    carrying = [t for t, c in reads if b"data: " in c]
    first, last = carrying[0] - sent, carrying[-1] - sent
    print(f"\n{tokens} token events in {len(carrying)} socket reads; first at {first * 1e3:.1f} ms, last at "
          f"{last * 1e3:.1f} ms")
    # buffered, they would come in one or two reads at the end; streamed, in several reads spread over the
    # generation (on a busy box the reader wakes less often: 5 reads over 48 ms once, with tests beside it)
    assert len(carrying) >= 3 and last - first >= 0.02, "the events came together: buffered, not streamed"


def test_metrics_of_gateway_and_replicas(ref):
    generate(ref["url"], "count me")
    text = http(f"{ref['url']}/metrics")[2].decode()
    assert 'gateway_requests_total{replica="triton-0"}' in text and "gateway_replica_healthy" in text
    replica_metrics = http(ref["replica_metrics_url"])[2].decode()
    for name in ("nv_inference_count", "tiny_lm_kv_pool_usage_ratio", "tiny_lm_kv_fragmentation_ratio",
                 "tiny_lm_kv_residency_seconds", "tiny_lm_kv_oom_total"):
        assert name in replica_metrics


def _metric(text: str, name: str, model: str = "tiny_lm") -> float:
    for line in text.splitlines():
        if line.startswith(f'{name}{{model="{model}"'):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{name} not found")


def test_published_facts_are_the_names_validation_checks(ref):
    """validate refuses a {target.*} a deployment cannot have from targets/facts.py's list: it must be what
    `ref up` publishes."""
    from chaoskit.targets.facts import addressable, reference_shape

    assert set(addressable("target", ref)) == set(addressable("target", reference_shape("triton", 2)))


def test_facts_name_each_replicas_model_processes(ref):
    """{target.replicas[N].model_pids}: the python backend stubs of that replica's tritonserver, one per model in
    TRITON_MODELS' order."""
    import psutil

    from chaoskit.targets.facts import TRITON_MODELS

    for r in ref["replicas"]:
        assert len(r["model_pids"]) == len(TRITON_MODELS) == 2
        for pid, model in zip(r["model_pids"], TRITON_MODELS, strict=True):
            stub = psutil.Process(pid)
            assert stub.ppid() == r["pid"] and stub.name() == "triton_python_backend_stub"
            assert Path(stub.cmdline()[1]).parent.parent.name == model


STOP_STUB = """\
apiVersion: chaoskit/v1
kind: Experiment
metadata: {name: stop-stub}
target: {reference: triton}
steadyState:
  probes:
    - name: replica-0-generates
      type: http
      method: POST
      url: "{target.replicas[0].url}/v2/models/tiny_lm/generate"
      body: {text_input: "hello", max_tokens: 1}
      timeout: 3s
      expect: {status: 200}
      phases: [before, after]
  after: {within: 2s, every: 500ms}
method:
  - name: stop-stub
    inject: {type: process.signal, pid: "{target.replicas[0].model_pids[0]}"}
    duration: 4s
"""


def test_a_stub_that_dies_during_its_fault_is_reported_and_ref_status_says_not_ready(tmp_path, state_dir):
    """The issue's story on this test's own deployment: a run SIGSTOPs replica 0's tiny_lm stub (by its fact) and
    the stub dies during the fault (the test kills it, as Triton did there): the run reports the exit and
    deviates for it (never "recovered"), and
    `ref status`, which asks each model for a token, says replica 0 is not ready while its tritonserver still
    runs and answers /v2/health/ready 200 (the blind spot of a liveness-only status)."""
    d, facts = start(tmp_path / "ref", 18400)
    env = {**os.environ, "CHAOSKIT_REF_DIR": str(tmp_path / "ref")}

    def status(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "chaoskit", "ref", "status", *args], env=env, cwd=ROOT,
                              capture_output=True, text=True, timeout=60)

    try:
        healthy = status("--json")
        assert healthy.returncode == 0, healthy.stdout + healthy.stderr
        assert all(p["ready"] for p in json.loads(healthy.stdout)["processes"])
        r0, stub = facts["replicas"][0], facts["replicas"][0]["model_pids"][0]
        (tmp_path / "stop-stub.yaml").write_text(STOP_STUB)
        run = subprocess.Popen([sys.executable, "-m", "chaoskit", "run", str(tmp_path / "stop-stub.yaml"), "--ci",
                                "--out", str(tmp_path / "out")], env={**env, "CHAOSKIT_STATE_DIR": str(state_dir)},
                               cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            wait_for(lambda: proc_state(stub) == "T", timeout=60)
            os.kill(stub, signal.SIGKILL)  # tiny_lm's stub of this test's own replica 0
            out, err = run.communicate(timeout=60)
        finally:
            if run.poll() is None:
                run.kill()
                run.communicate()
        text = f"PID {stub} triton_python_backend_stub exited during the fault (a zombie"
        assert run.returncode == 1 and f"deviation: stop-stub: {text}" in out, out + err  # recovered means alive
        assert f"deviation: not recovered: target process {stub} (triton_python_backend_stub) exited" in out
        assert "recovered" not in out.replace("not recovered", "")
        assert f"fault #1 process.signal (stop-stub): {text}" in out
        assert text in (tmp_path / "out" / "report.html").read_text()
        assert http(f"{r0['url']}/v2/health/ready")[0] == 200  # what a liveness check sees
        sick = status("--json")
        rows = {p["name"]: p for p in json.loads(sick.stdout)["processes"]}
        assert sick.returncode == 1 and rows["triton-0"]["alive"] and not rows["triton-0"]["ready"]
        message = "POST /v2/models/tiny_lm/generate: HTTP 400: Stub process 'tiny_lm_0_0' is not healthy."
        assert rows["triton-0"]["check"] == message, rows["triton-0"]
        assert rows["triton-1"]["ready"] and rows["gateway"]["ready"]
        table = status()
        print(f"\n{out}\n{table.stdout}")
        words = " ".join(table.stdout.replace("|", " ").split())  # piped, a long cell wraps at words
        assert table.returncode == 1 and "Stub process 'tiny_lm_0_0' is not healthy." in words, table.stdout
    finally:
        pids = [p["pid"] for p in d.processes()]
        d.down(say=lambda _m: None)
        assert_all_gone(d, pids, [18400 + k for k in range(7)])


def _process_experiments() -> list[Path]:
    """Bundled Triton experiments whose faults select processes (by PID, parent or name)."""
    from chaoskit.experiment.loader import load_experiment

    found = []
    for f in sorted((ROOT / "experiments").rglob("*.yaml")):
        exp = load_experiment(f, strict=False).experiment
        ref = exp.target.reference
        engine = ref if isinstance(ref, str) or ref is None else ref.engine
        specs = [s.inject.model_dump() for _, s in _inject_steps(exp.method)]
        if engine in ("triton", None) and any({"pid", "child_of", "name"} & set(d) for d in specs):
            found.append(f)
    return found


def _inject_steps(steps):
    from chaoskit.engine.plan import inject_steps

    return inject_steps(steps)


def _same_names(lines: list[str]) -> list[str]:
    """The plan with the names made of each run's id (its cgroups) made equal."""
    return [re.sub(r"chaoskit-[0-9a-f]{12}", "chaoskit-RUN", line) for line in lines]


def test_a_dry_run_plans_the_targets_its_run_plans(ref, tmp_path):
    """Every bundled experiment that targets processes, against a running deployment it would reuse: the dry
    run's plan (the CLI's output) is the plan the run makes from the facts it gets."""
    from chaoskit.engine.plan import UNRESOLVED, plan_faults
    from chaoskit.experiment.loader import load_experiment
    from chaoskit.experiment.models import Reference
    from chaoskit.reference.scenario import running_facts

    env = {**os.environ, "CHAOSKIT_REF_DIR": str(Path(ref["model_repository"]).parent),
           "CHAOSKIT_STATE_DIR": str(tmp_path / "state")}
    compared = []
    for f in _process_experiments():
        p = subprocess.run([sys.executable, "-m", "chaoskit", "run", "--dry-run", str(f)], env=env, cwd=ROOT,
                           capture_output=True, text=True, timeout=120)
        lines = p.stdout.splitlines()
        start = next(i for i, line in enumerate(lines) if line.startswith("plan for "))
        dry = [line.strip() for line in lines[start + 1:] if line.startswith("      ")]
        os.environ["CHAOSKIT_REF_DIR"] = env["CHAOSKIT_REF_DIR"]
        try:
            declared = load_experiment(f, strict=False).experiment.target.reference
            deployed = running_facts(declared) if isinstance(declared, Reference) else None
            if isinstance(declared, Reference) and deployed is None:  # other settings: the run starts its own
                assert UNRESOLVED in dry, (f, dry)
                continue
            loaded = load_experiment(f, deployed=deployed)
        finally:
            del os.environ["CHAOSKIT_REF_DIR"]
        _, plan, _ = plan_faults(loaded.experiment.method)
        run = [line for step in plan for line in step.changes]
        assert _same_names(dry) == _same_names(run), (f, p.stderr)
        assert UNRESOLVED not in dry, (f, dry)
        compared.append(f.stem)
    assert {"stop-http-server", "stall-one-replica", "health-check-blindspot", "oom-kills-healthy-replica"} <= \
        set(compared), compared


def test_residue_exhausts_the_pool_like_an_oom(tmp_path):
    """Residue of mid-size requests cannot hold a bigger one; with eviction `none` it is never evicted: OOM."""
    d, facts = start(tmp_path, 18340, replicas=1,
                     model_params={"isolate_kv_cache": "false", "cache_eviction_policy": "none",
                                   "memory_budget": "8MiB"})
    try:
        url = facts["replica_url"]
        # growing sizes, one after the other: none fits in an earlier one's residue, so three residues stay
        # (three concurrent requests of one size left one or three, as the batcher happened to overlap them)
        assert [generate(url, "M" * n, 2)[0] for n in (900, 950, 1000)] == [200] * 3
        status, headers, body = generate(facts["url"], "L" * 2000, 2)
        print(f"\nKV pool 8 MiB, residue of 900 + 950 + 1000-token requests, then 2000 tokens: HTTP {status} "
              f"{body[:120]!r}")
        assert status >= 400 and b"out of memory" in body and float(headers["X-Model-Latency"]) > 0
        assert _metric(http(facts["replica_metrics_url"])[2].decode(), "tiny_lm_kv_oom_total") >= 1
    finally:
        d.down(say=lambda _m: None)


def test_down_after_a_killed_up_leaves_nothing(tmp_path):
    env = {**os.environ, "CHAOSKIT_REF_DIR": str(tmp_path)}
    up = subprocess.Popen([sys.executable, "-m", "chaoskit", "ref", "up", "--port", "18370"], env=env, cwd=ROOT,
                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    d = Deployment(tmp_path)
    wait_for(lambda: len(d.processes()) >= 2, timeout=60)
    up.send_signal(signal.SIGKILL)
    up.wait()
    pids = [p["pid"] for p in d.processes()]
    assert any("tritonserver" in " ".join(cmdline(p)) for p in pids)
    t0 = time.monotonic()
    result = subprocess.run([sys.executable, "-m", "chaoskit", "ref", "down"], env=env, cwd=ROOT,
                            capture_output=True, text=True, timeout=60)
    took = time.monotonic() - t0
    assert result.returncode == 0, result.stderr
    assert_all_gone(d, pids, [18370 + k for k in range(7)])
    assert not d.processes()
    # a tritonserver killed while it starts may ignore SIGTERM: a deployment that never came up gets 3 s, not 15
    assert took < 10, took


def test_down_removes_the_shared_memory_a_killed_tritonserver_left(tmp_path):
    """A SIGKILLed tritonserver cannot remove its python backend's /dev/shm regions; leaked ones broke later
    servers' stubs (boost::interprocess::lock_exception): `down` removes those named with the replica's prefix."""
    d, facts = start(tmp_path, 18390)
    prefix = d.shm_prefix("triton-0")
    assert list(Path("/dev/shm").glob(prefix + "*"))  # the prefix reached the python backend
    os.kill(facts["replica_pid"], signal.SIGKILL)
    wait_for(lambda: proc_state(facts["replica_pid"]) in (None, "Z"), timeout=10)
    assert list(Path("/dev/shm").glob(prefix + "*"))  # left behind by the killed server
    d.down(say=lambda _m: None)
    assert not list(Path("/dev/shm").glob(prefix + "*"))


def test_bad_options_are_clear_errors(tmp_path):
    env = {**os.environ, "CHAOSKIT_REF_DIR": str(tmp_path)}
    for args, text in ((["--engine", "tgi"], "expected triton, vllm or tiny-openai"), (["--health", "x"], "status or latency"),
                       (["--model-param", "novalue"], "KEY=VALUE")):
        r = subprocess.run([sys.executable, "-m", "chaoskit", "ref", "up", *args], env=env, cwd=ROOT,
                           capture_output=True, text=True, timeout=60)
        assert r.returncode == 2 and text in r.stderr and "Traceback" not in r.stderr
    with socket.create_server(("127.0.0.1", 18380)):
        r = subprocess.run([sys.executable, "-m", "chaoskit", "ref", "up", "--port", "18380"], env=env, cwd=ROOT,
                           capture_output=True, text=True, timeout=60)
    assert r.returncode == 4 and "ports in use: 18380" in r.stderr
