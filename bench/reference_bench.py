"""Reference deployment benchmark: startup time and memory of the Triton engine (and of vLLM when installed).

For each of N runs (default 3): `ref up` with one replica, time until a real generate request succeeds
through the gateway, resident memory (RSS) of the replica's whole process group (tritonserver + python
backend stubs) and of the gateway, then `ref down`. Anchor, same run: a bare tritonserver with an empty
model repository, time to ready (what model loading adds on top of the server itself).

The same N runs with `--engine vllm` (one replica; `make vllm` installs it): time until a real completion
succeeds through the gateway, RSS of the replica's process group (API server, EngineCore, Worker).

RESULT keys: triton_startup_s (median), triton_bare_ready_s (anchor median), model_load_overhead_ratio
(startup / bare), triton_replica_rss_mib, gateway_rss_mib, vllm_startup_s, vllm_replica_rss_mib (nan when the
vLLM engine is not installed), failed (runs whose deployment did not come up and answer; each is printed), goal_met,
missed=.

Goal (GOALS below; exit 1 when missed): every deployment comes up and answers a real request through its gateway
(failed <= 0). No start-up time or memory goal has been set for the reference deployment (none in the issues or
docs/benchmarks.md): those figures are measured and shown, not judged.
"""

from __future__ import annotations

import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from chaoskit.reference import triton, vllm
from chaoskit.reference.deploy import Deployment, RefOptions
from chaoskit.targets.process import group_members

sys.path.insert(0, str(Path(__file__).resolve().parent))
from goals import Goal, Goals  # noqa: E402

GOALS = Goals(Goal("failed", "<=", 0, "runs whose deployment did not come up and answer through its gateway"))
N = int(os.environ.get("BENCH_RUNS", "3"))
NAN = float("nan")
PAGE = os.sysconf("SC_PAGE_SIZE")


def rss_mib(pgid: int) -> float:
    total = 0
    for pid in group_members(pgid):
        try:
            total += int(Path(f"/proc/{pid}/statm").read_text().split()[1]) * PAGE
        except OSError:
            pass
    return total / 2**20


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def bare_ready_s(tmp: Path) -> float:
    (tmp / "empty").mkdir(exist_ok=True)
    backends = triton.backend_dir(tmp / "backends")
    http = free_port()
    argv = triton.argv(tmp / "empty", backends, "127.0.0.1", http, free_port(), free_port())
    t0 = time.monotonic()
    proc = subprocess.Popen(argv, env=triton.env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{http}/v2/health/ready", timeout=1) as r:
                    if r.status == 200:
                        return time.monotonic() - t0
            except OSError:
                time.sleep(0.05)
    finally:
        proc.terminate()
        proc.wait()


def med(vals: list[float]) -> float:
    return statistics.median(vals) if vals else NAN


def main() -> int:
    starts, bares, replica_rss, gateway_rss = [], [], [], []
    failed = 0
    for i in range(N):
        with tempfile.TemporaryDirectory() as tmp:
            bares.append(bare_ready_s(Path(tmp)))
            d = Deployment(Path(tmp) / "ref")
            t0 = time.monotonic()
            try:
                d.up(RefOptions(port=19000 + 10 * i, replicas=1), say=lambda _m: None)
            except Exception as e:  # counted and shown; the next run goes on
                failed += 1
                print(f"run {i + 1}: FAILED to come up: {e!r}")
                d.down(say=lambda _m: None)
                continue
            starts.append(time.monotonic() - t0)
            procs = {p["name"]: p["pid"] for p in d.processes()}
            replica_rss.append(rss_mib(procs["triton-0"]))
            gateway_rss.append(rss_mib(procs["gateway"]))
            print(f"run {i + 1}: up {starts[-1]:.2f}s (bare tritonserver ready {bares[-1]:.2f}s), replica RSS "
                  f"{replica_rss[-1]:.0f} MiB, gateway {gateway_rss[-1]:.0f} MiB")
            d.down(say=lambda _m: None)
    vstart, vrss, vfailed = vllm_runs()
    s, b = med(starts), med(bares)
    return GOALS.result({
        "triton_startup_s": f"{s:.2f}", "triton_bare_ready_s": f"{b:.2f}", "model_load_overhead_ratio": f"{s / b:.2f}",
        "triton_replica_rss_mib": f"{med(replica_rss):.0f}", "gateway_rss_mib": f"{med(gateway_rss):.0f}",
        "vllm_startup_s": f"{vstart:.2f}", "vllm_replica_rss_mib": f"{vrss:.0f}", "failed": failed + vfailed})


def vllm_runs() -> tuple[float, float, int]:
    """Median startup (s) and replica RSS (MiB) of the vLLM engine over N runs (nan when it is not installed),
    and the runs that did not come up."""
    if not vllm.installed():
        print("vLLM engine not installed (`make vllm`): vllm_* are nan")
        return NAN, NAN, 0
    starts, rss, failed = [], [], 0
    for i in range(N):
        with tempfile.TemporaryDirectory() as tmp:
            d = Deployment(Path(tmp) / "ref")
            t0 = time.monotonic()
            try:
                d.up(RefOptions(engine="vllm", port=19500 + 10 * i, replicas=1), say=lambda _m: None)
            except Exception as e:
                failed += 1
                print(f"vllm run {i + 1}: FAILED to come up: {e!r}")
                d.down(say=lambda _m: None)
                continue
            starts.append(time.monotonic() - t0)
            rss.append(rss_mib({p["name"]: p["pid"] for p in d.processes()}["vllm-0"]))
            print(f"vllm run {i + 1}: up {starts[-1]:.2f}s, replica RSS {rss[-1]:.0f} MiB")
            d.down(say=lambda _m: None)
    return med(starts), med(rss), failed


if __name__ == "__main__":
    sys.exit(main())
