"""Rollback latency benchmark: how fast chaoskit applies a fault, rolls it back, and how fast the watchdog
reverts after chaoskit is SIGKILLed. Medians over N runs (default 20) on a real SIGSTOPped process.

Anchor: the raw cost of the same action without chaoskit (one os.kill + wait for the stopped state), measured
in the same run, so the ratios hold on noisy machines.

RESULT keys: apply_ms (median request->fault in effect, from the journal), rollback_ms (median rollback phase),
watchdog_ms (median SIGKILL of chaoskit -> target running again), raw_apply_ms (anchor),
apply_overhead_ratio (apply_ms / raw_apply_ms). Goals: apply <= 50 ms, rollback <= 1 s, watchdog <= 2 s.
"""

from __future__ import annotations

import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from chaoskit.targets.process import proc_state

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


def one_run(tmp: Path, pid: int, env: dict, i: int) -> tuple[float, float]:
    exp = tmp / f"e{i}.yaml"
    exp.write_text(EXP.format(pid=pid, duration=""))  # no duration: the rollback phase reverts it
    out = tmp / f"run{i}"
    subprocess.run([sys.executable, "-m", "chaoskit", "run", str(exp), "--out", str(out), "--plain"], env=env,
                   cwd=ROOT, check=True, stdout=subprocess.DEVNULL)
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


def main() -> None:
    target = subprocess.Popen(["sleep", "3600"])
    try:
        with tempfile.TemporaryDirectory() as d:
            tmp = Path(d)
            env = {**os.environ, "CHAOSKIT_STATE_DIR": str(tmp / "state")}
            raw = [raw_apply_ms(target.pid) for _ in range(N)]
            runs = [one_run(tmp, target.pid, env, i) for i in range(N)]
            wd = [watchdog_run(tmp, target.pid, env, i) for i in range(N)]
    finally:
        target.kill()
        target.wait()
    med = statistics.median
    apply_ms, rollback_ms = med(r[0] for r in runs), med(r[1] for r in runs)
    watchdog_ms, raw_ms = med(wd), med(raw)
    print(f"{'measure':<28}{'median ms':>12}{'p90 ms':>10}{'goal':>10}")
    for name, vals, goal in (("raw SIGSTOP (anchor)", raw, "-"), ("apply", [r[0] for r in runs], "50"),
                             ("rollback", [r[1] for r in runs], "1000"), ("watchdog after SIGKILL", wd, "2000")):
        vals = sorted(vals)
        print(f"{name:<28}{med(vals):>12.2f}{vals[int(0.9 * (len(vals) - 1))]:>10.2f}{goal:>10}")
    print(f"RESULT apply_ms={apply_ms:.3f} rollback_ms={rollback_ms:.3f} watchdog_ms={watchdog_ms:.3f} "
          f"raw_apply_ms={raw_ms:.3f} apply_overhead_ratio={apply_ms / raw_ms:.2f}")


if __name__ == "__main__":
    main()
