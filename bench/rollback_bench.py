"""Rollback latency benchmark: how fast chaoskit applies a fault, rolls it back, and how fast the watchdog
reverts after chaoskit is SIGKILLed. Medians over N runs (default 20) on a real SIGSTOPped process.

Anchor: the raw cost of the same action without chaoskit (one os.kill + wait for the stopped state), measured
in the same run, so the ratios hold on noisy machines.

Exporters (issue 34): the same run with every exporter pointed where it cannot work (--metrics-port on a port
another socket listens on, --pushgateway and --otlp-endpoint on closed ports) against the same run without them,
N runs each, interleaved (none, exporters, none, ...) so both meet the same machine load.

RESULT keys: apply_ms (median request->fault in effect, from the journal), rollback_ms (median rollback phase),
watchdog_ms (median SIGKILL of chaoskit -> target running again), raw_apply_ms (anchor),
apply_overhead_ratio (apply_ms / raw_apply_ms), rollback_none_ms / rollback_exporters_ms (medians of the
interleaved pair), run_none_ms / run_exporters_ms (median wall time of the whole `chaoskit run` process),
rollback_exporters_ratio (exporters / none), exporters_overlap (1 when the p10-p90 ranges of the rollback with
and without exporters overlap, 0 when not), goal_met, missed= (the goals missed). BENCH_PARTS (default
"latency,exporters") picks the parts; a part left out leaves its goals unjudged.

Goals (GOALS below; exit 1 when one is missed; `--goal key=value` sets one for a run, see bench/goals.py): apply
<= 50 ms, rollback <= 1 s, watchdog revert <= 100 ms after a SIGKILL of the run (raised from 2 s: 65-109 ms
measured), and dead exporters do not slow the rollback (the ranges overlap).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from chaoskit.targets.process import proc_state

sys.path.insert(0, str(Path(__file__).resolve().parent))
from goals import Goal, Goals  # noqa: E402

GOALS = Goals(Goal("apply_ms", "<=", 50, "median request -> fault in effect"),
              Goal("rollback_ms", "<=", 1000, "median rollback phase"),
              Goal("watchdog_ms", "<=", 100, "median SIGKILL of the run -> target running again"),
              Goal("exporters_overlap", ">=", 1, "rollback p10-p90 with dead exporters overlaps the one without"))

N = int(os.environ.get("BENCH_RUNS", "20"))
ROOT = Path(__file__).resolve().parent.parent
EXP = """\
apiVersion: chaoskit/v1
kind: Experiment
metadata: {{name: bench}}
steadyState:
  probes: [{{name: t, type: command, argv: ["true"], phases: [before]}}]
  during: null
  after: {{within: 0s}}
method:
  - inject: {{type: process.signal, pid: {pid}}}
{duration}  - pause: 100ms
"""


def raw_apply_ms(pid: int) -> float:
    t0 = time.perf_counter()
    os.kill(pid, signal.SIGSTOP)
    while proc_state(pid) != "T":
        pass
    ms = (time.perf_counter() - t0) * 1000
    os.kill(pid, signal.SIGCONT)
    while proc_state(pid) == "T":
        pass
    return ms


def one_run(tmp: Path, pid: int, env: dict, i: int, extra: tuple[str, ...] = ()) -> tuple[float, float]:
    exp = tmp / f"e{i}.yaml"
    exp.write_text(EXP.format(pid=pid, duration=""))  # no duration: the rollback phase reverts it
    out = tmp / f"run{i}"
    done = subprocess.run([sys.executable, "-m", "chaoskit", "run", str(exp), "--out", str(out), "--plain", *extra],
                          env=env, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    if done.returncode != 0:  # the exporters' warnings are expected; anything else is shown
        raise RuntimeError(f"chaoskit run exited {done.returncode}: {done.stderr[-2000:]}")
    events = [json.loads(x) for x in (out / "journal.jsonl").read_text().splitlines()]
    apply_ms = next(e["apply_ms"] for e in events if e["event"] == "fault_applied")
    rollback = next(e for e in events if e["event"] == "rollback")
    assert rollback["reverted"] == 1 and rollback["failed"] == 0
    return apply_ms, rollback["ms"]


def watchdog_run(tmp: Path, pid: int, env: dict, i: int) -> float:
    exp = tmp / f"w{i}.yaml"
    exp.write_text(EXP.format(pid=pid, duration="    duration: 60s\n"))
    proc = subprocess.Popen([sys.executable, "-m", "chaoskit", "run", str(exp), "--out", str(tmp / f"w{i}"),
                             "--plain"], env=env, cwd=ROOT, stdout=subprocess.DEVNULL)
    journal = tmp / f"w{i}" / "journal.jsonl"
    deadline = time.monotonic() + 30
    while not (journal.exists() and "fault_applied" in journal.read_text()):
        if time.monotonic() > deadline:
            proc.kill()
            raise RuntimeError("fault never applied")
        time.sleep(0.005)
    t0 = time.perf_counter()
    proc.kill()
    while proc_state(pid) == "T":
        time.sleep(0.0005)
    ms = (time.perf_counter() - t0) * 1000
    proc.wait()
    return ms


def dead_ports() -> tuple[socket.socket, socket.socket, tuple[str, ...]]:
    """A port another socket listens on (for --metrics-port) and one bound but not listening (connections to it
    are refused: the closed --pushgateway and --otlp-endpoint). Keep both sockets open while the runs use them."""
    busy = socket.create_server(("127.0.0.1", 0))
    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))
    url = f"http://127.0.0.1:{closed.getsockname()[1]}"
    return busy, closed, ("--metrics-port", str(busy.getsockname()[1]), "--pushgateway", url,
                          "--otlp-endpoint", url)


def exporter_runs(tmp: Path, pid: int, env: dict) -> dict[str, list[tuple[float, float]]]:
    """N runs without exporters and N with every exporter dead, interleaved: (rollback ms, whole run ms) each."""
    busy, closed, extra = dead_ports()
    out: dict[str, list[tuple[float, float]]] = {"none": [], "exporters": []}
    try:
        for i in range(2 * N):
            kind = "exporters" if i % 2 else "none"
            t0 = time.perf_counter()
            _, rollback = one_run(tmp, pid, env, 1000 + i, extra if i % 2 else ())
            out[kind].append((rollback, (time.perf_counter() - t0) * 1000))
    finally:
        busy.close()
        closed.close()
    return out


def spread(vals: list[float]) -> str:
    vals = sorted(vals)
    return f"{statistics.median(vals):>10.2f}{vals[int(0.1 * (len(vals) - 1))]:>10.2f}" \
           f"{vals[int(0.9 * (len(vals) - 1))]:>10.2f}{vals[0]:>10.2f}{vals[-1]:>10.2f}"


def p10_p90(vals: list[float]) -> tuple[float, float]:
    vals = sorted(vals)
    return vals[int(0.1 * (len(vals) - 1))], vals[int(0.9 * (len(vals) - 1))]


def main() -> int:
    parts = os.environ.get("BENCH_PARTS", "latency,exporters").split(",")
    target = subprocess.Popen(["sleep", "3600"])
    raw: list[float] = []
    runs: list[tuple[float, float]] = []
    wd: list[float] = []
    exp: dict[str, list[tuple[float, float]]] = {}
    try:
        with tempfile.TemporaryDirectory() as d:
            tmp = Path(d)
            env = {**os.environ, "CHAOSKIT_STATE_DIR": str(tmp / "state")}
            env.pop("OTEL_EXPORTER_OTLP_ENDPOINT", None)  # "none" means none
            if "latency" in parts:
                raw = [raw_apply_ms(target.pid) for _ in range(N)]
                runs = [one_run(tmp, target.pid, env, i) for i in range(N)]
                wd = [watchdog_run(tmp, target.pid, env, i) for i in range(N)]
            if "exporters" in parts:
                exp = exporter_runs(tmp, target.pid, env)
    finally:
        target.kill()
        target.wait()
    med = statistics.median
    print(f"{'measure':<32}{'median':>10}{'p10':>10}{'p90':>10}{'min':>10}{'max':>10}  ms")
    keys: dict[str, str] = {}
    if runs:
        for name, vals in (("raw SIGSTOP (anchor)", raw), ("apply", [r[0] for r in runs]),
                           ("rollback", [r[1] for r in runs]), ("watchdog after SIGKILL", wd)):
            print(f"{name:<32}{spread(vals)}")
        apply_ms, raw_ms = med(r[0] for r in runs), med(raw)
        keys.update(apply_ms=f"{apply_ms:.3f}", rollback_ms=f"{med(r[1] for r in runs):.3f}",
                    watchdog_ms=f"{med(wd):.3f}", raw_apply_ms=f"{raw_ms:.3f}",
                    apply_overhead_ratio=f"{apply_ms / raw_ms:.2f}")
    if exp:
        for kind in ("none", "exporters"):
            print(f"{'rollback, ' + kind:<32}{spread([r[0] for r in exp[kind]])}")
            print(f"{'whole run, ' + kind:<32}{spread([r[1] for r in exp[kind]])}")
        rb = {k: med(r[0] for r in v) for k, v in exp.items()}
        wall = {k: med(r[1] for r in v) for k, v in exp.items()}
        (lo_n, hi_n), (lo_e, hi_e) = (p10_p90([r[0] for r in exp[k]]) for k in ("none", "exporters"))
        keys.update(rollback_none_ms=f"{rb['none']:.3f}", rollback_exporters_ms=f"{rb['exporters']:.3f}",
                    run_none_ms=f"{wall['none']:.0f}", run_exporters_ms=f"{wall['exporters']:.0f}",
                    rollback_exporters_ratio=f"{rb['exporters'] / rb['none']:.2f}",
                    exporters_overlap=int(lo_e <= hi_n and lo_n <= hi_e))
    return GOALS.result(keys)


if __name__ == "__main__":
    sys.exit(main())
