"""Torture: kill `chaoskit run` at random points, every way a run dies, and check the host is as before.

Each run applies every host-testable injector at once (process.signal SIGSTOP, host.memory_pressure,
network.bandwidth egress + ingress (IFB), network.drop, network.proxy) in namespaces this script creates, and
is killed at a seeded random moment by SIGINT, SIGTERM, SIGKILL, or a whole-cgroup kill (every process in the
job's cgroups SIGKILLed, as a cancelled CI job). The moment is drawn from one of two anchors, the seed choosing:
the run's start (0-5 s after it: validate, preflight, apply, hold, revert, rollback), or its first fault in
effect (0-1.2 s after the ledger shows one, within the first step's 1.5 s: a kill with faults in effect however
slow the box is to get there). After the run is gone the host must match the baseline snapshot (qdiscs, ingress
filters, links, nft rulesets per namespace, chaoskit-* cgroups, chaoskit's helper processes and watchdogs,
open ledgers, loop devices, mounts, the target's signal state) within 3 s.

    .venv/bin/python bench/torture.py --runs 50 [--seed 1]

Just before each kill the run's ledger is read: a run killed while at least one fault was applied and not yet
reverted is one that tested cleanup; one killed before any apply (or after everything was reverted) is clean
whatever the cleanup does. Prints a line per run (with what the ledger held at the kill), `N/N clean`, the seed
and diff of any failure. Last line:
`RESULT clean=N runs=N cgroup_kills=K sigkills=K max_clean_s=S killed_with_faults_applied=K goal_met=B` (goal:
every run clean; exit 1 when missed).
"""

from __future__ import annotations

import argparse
import os
import random
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from chaoskit.engine.ledger import Ledger  # noqa: E402
from tests.helpers.hoststate import diff, snapshot  # noqa: E402
from tests.helpers.jobcgroup import enter_job, kill_job, make_job_cgroups, remove_job_cgroups  # noqa: E402
from tests.helpers.netpair import Pair  # noqa: E402

KINDS = ("sigint", "sigterm", "sigkill", "cgroup")
ANCHORS = ("start", "applied")  # what a kill's moment is counted from
CLEAN_WITHIN_S = 3.0
EXPERIMENT = """\
apiVersion: chaoskit/v1
kind: Experiment
metadata: {{name: torture}}
steadyState:
  probes:
    - {{name: alive, type: command, argv: ["true"]}}
  during: {{every: 200ms}}
  after: {{within: 5s, every: 200ms}}
method:
  - parallel:
      - inject: {{type: process.signal, pid: {pid}}}
        duration: 1500ms
      - inject: {{type: host.memory_pressure, size: 16MiB}}
        duration: 1500ms
      - inject: {{type: network.bandwidth, target: {{netns: {srv}}}, rate: 16mbit}}
        duration: 1500ms
      - inject: {{type: network.drop, target: {{netns: {cli}}}, percent: 30%}}
        duration: 1500ms
      - inject:
          type: network.proxy
          listen: 127.0.0.1:{listen}
          upstream: 127.0.0.1:{upstream}
          toxics: [{{type: latency, latency: 10ms}}]
        duration: 1500ms
  - inject: {{type: network.bandwidth, target: {{netns: {cli}}}, rate: 8mbit, direction: ingress}}
    duration: 700ms
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def ledger_files(state: Path) -> set[Path]:
    return set((state / "ledgers").glob("*.jsonl"))


def ledger_now(state: Path, before: set[Path], pid: int) -> dict[str, int] | None:
    """The run's ledger (new since it started, owned by `pid`) as it is now: faults applied and not reverted,
    faults only intended (an apply under way), faults reverted. None: it has no open ledger (not opened yet, or
    closed and deleted after a complete rollback): nothing of it in effect."""
    for path in ledger_files(state) - before:
        st = Ledger(path).read()
        if st.closed or st.owner is None or st.owner.pid != pid:
            continue
        out = {"in_effect": 0, "intended": 0, "reverted": 0}
        for e in st.entries.values():
            out["reverted" if e.reverted else "in_effect" if e.applied else "intended"] += 1
        return out
    return None


def one_run(i: int, rng: random.Random, exp: Path, state: Path, sleeper: int, namespaces: list[str]) -> dict:
    kind, anchor = rng.choice(KINDS), rng.choice(ANCHORS)
    at = rng.uniform(0.0, 5.0) if anchor == "start" else rng.uniform(0.0, 1.2)
    before = snapshot([sleeper], state, namespaces)
    job = make_job_cgroups() if kind == "cgroup" else []
    env = {**os.environ, "CHAOSKIT_STATE_DIR": str(state)}
    ledgers_before = ledger_files(state)
    run = subprocess.Popen([sys.executable, "-m", "chaoskit", "run", str(exp), "--plain", "--out",
                            str(state / f"run-{i}")], env=env, cwd=ROOT, stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL, preexec_fn=(lambda: enter_job(job)) if job else None)
    if anchor == "applied":
        deadline = time.monotonic() + 60
        while not ((k := ledger_now(state, ledgers_before, run.pid)) and k["in_effect"]) and run.poll() is None \
                and time.monotonic() < deadline:
            time.sleep(0.01)
    time.sleep(at)
    finished_first = run.poll() is not None
    at_kill = ledger_now(state, ledgers_before, run.pid)  # read just before the kill: what it finds in effect
    if kind == "cgroup":
        kill_job(job)
    elif not finished_first:
        run.send_signal({"sigint": signal.SIGINT, "sigterm": signal.SIGTERM, "sigkill": signal.SIGKILL}[kind])
    run.wait(timeout=60)
    if job:
        remove_job_cgroups(job)
    t0 = time.monotonic()
    while (d := diff(before, snapshot([sleeper], state, namespaces))) and time.monotonic() - t0 < CLEAN_WITHIN_S:
        time.sleep(0.1)
    return {"kind": kind, "anchor": anchor, "at": at, "exit": run.returncode, "finished_first": finished_first,
            "diff": d, "clean_s": time.monotonic() - t0, "at_kill": at_kill,
            "with_faults": not finished_first and at_kill is not None and at_kill["in_effect"] > 0}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=50)
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    if os.geteuid() != 0:
        print("torture needs root (namespaces, qdiscs, nftables, cgroups)")
        print("RESULT clean=0 runs=0 cgroup_kills=0 sigkills=0 max_clean_s=nan killed_with_faults_applied=0 "
              "goal_met=False")
        return 4
    rng = random.Random(args.seed)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # clean up the namespaces and the target on SIGTERM
    pair = Pair()
    sleeper = subprocess.Popen(["sleep", "100000"])
    upstream = socket.create_server(("127.0.0.1", 0))  # the proxy's upstream: listening is all it needs
    results = []
    try:
        with tempfile.TemporaryDirectory(prefix="chaoskit-torture-") as tmp:
            state, exp = Path(tmp), Path(tmp) / "torture.yaml"
            exp.write_text(EXPERIMENT.format(pid=sleeper.pid, srv=pair.srv, cli=pair.cli, listen=free_port(),
                                             upstream=upstream.getsockname()[1]))
            for i in range(args.runs):
                r = one_run(i, rng, exp, state, sleeper.pid, [pair.srv, pair.cli])
                results.append(r)
                k = r["at_kill"]
                held = ("no open ledger" if k is None else
                        f"ledger: {k['in_effect']} in effect, {k['intended']} being applied, {k['reverted']} reverted")
                print(f"run {i + 1:3d}: {r['kind']:7s} {r['at']:.2f}s after its {r['anchor']} exit {r['exit']}"
                      f"{' (finished before the kill)' if r['finished_first'] else f' ({held} at the kill)'}: "
                      + ("clean" if not r["diff"] else "LEFT BEHIND"), flush=True)
                for line in r["diff"]:
                    print(f"    {line}")
    finally:
        sleeper.kill()
        upstream.close()
        pair.close()
    clean = sum(1 for r in results if not r["diff"])
    failed = [r for r in results if r["diff"]]
    print(f"{clean}/{len(results)} clean (seed {args.seed})")
    for r in failed:
        print(f"  failure: seed {args.seed}, {r['kind']} {r['at']:.3f}s after its {r['anchor']}: {len(r['diff'])} "
              "differences")
    kinds = {k: sum(1 for r in results if r["kind"] == k) for k in KINDS}
    with_faults = sum(1 for r in results if r["with_faults"])
    print(f"kills by kind: {kinds}; runs that finished before their kill: "
          f"{sum(1 for r in results if r['finished_first'])}; killed with faults in effect: {with_faults} "
          f"(clean: {sum(1 for r in results if r['with_faults'] and not r['diff'])})")
    print(f"RESULT clean={clean} runs={len(results)} cgroup_kills={kinds['cgroup']} sigkills={kinds['sigkill']} "
          f"max_clean_s={max((r['clean_s'] for r in results), default=0):.2f} "
          f"killed_with_faults_applied={with_faults} goal_met={clean == len(results)}")
    return 0 if clean == len(results) else 1


if __name__ == "__main__":
    sys.exit(main())
