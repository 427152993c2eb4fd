"""`chaoskit matrix` on real gateways (vLLM Router, nginx, HAProxy) and real faults of replica 0: every cell gets
a verdict and its measures, checked against what the replicas' own request logs counted; a matrix killed
mid-cell leaves nothing applied and --resume finishes it."""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT, wait_for

SMALL = ROOT / "tests" / "fixtures" / "matrix-small.yaml"
GATEWAYS = ("vllm-router", "nginx", "haproxy")
REPLICAS = ("tiny-openai-0", "tiny-openai-1")
BIN_S, EJECTED = 0.5, 0.05  # the docs' definition of the time to eject (docs/how-to/gateways.md), restated
# How much later a replica logs a request (t0, its handler's start) than the tap saw it pass: the hop is under a
# millisecond; the replica throttled to 5% CPU started its handler up to 26 ms late in our runs; 0.1 s is the
# throttle's CFS period (cpu_throttle's default), the longest a replica that keeps up waits for its quota. The
# gateway's attempts to one replica come a client interval apart or more (50 ms at 20/s; twice that with two
# replicas), so at each edge of the fault's span at most one attempt can fall inside for one side and outside for
# the other: counts agree within 2. The time to eject is counted in 0.5 s bins: an attempt within LAG of a bin's
# edge may sit in the next bin at the replica, so the tap's value lies between the ones the replica's log gives
# with its times taken LAG earlier and as they are.
LAG, EDGE = 0.1, 2
LOAD_PATH = "/v1/completions"  # the clients' streamed load; the answers probe sends chat completions

pytestmark = [pytest.mark.root, pytest.mark.timeout(900)]


def chaoskit(*args: str, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "chaoskit", *args], capture_output=True, text=True,
                          env={**os.environ, "NO_COLOR": "1"}, **kw)


@pytest.fixture(scope="module")
def installed() -> None:
    for g in GATEWAYS:
        r = chaoskit("ref", "install", f"gateway-{g}", timeout=600)
        assert r.returncode == 0, r.stderr[-2000:]


def lines(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []


def test_a_small_matrix_measures_every_cell(installed, tmp_path: Path) -> None:
    out = tmp_path / "m"
    r = chaoskit("matrix", str(SMALL), "--out", str(out), timeout=800)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    summary = json.loads((out / "matrix.json").read_text())
    cells = {(c["gateway"], c["fault"]): c for c in summary["cells"]}
    assert len(cells) == 12 and {c["measures"]["verdict"] for c in cells.values()} <= {"held", "deviated"}
    for (_, fault), c in cells.items():
        m, d = c["measures"], out / "cells" / c["cell"]
        assert m["amplification"] is not None and m["fault_s"] >= 4.0, (c["cell"], m["verdict"], m["deviations"])
        # the tap's count of what reached each replica against the replicas' own logs, over the whole cell
        tap = [a for a in lines(next(d.glob("ref-*/logs/tap.requests.jsonl"))) if a["path"].endswith("completions")]
        # some completions go straight to a replica, so only its own log has them: the readiness probe at the
        # start and the check that it still serves after each sample of the after phase (one, or more when the
        # first sample did not hold)
        direct = 1 + sum(e["event"] == "service_checked" for e in lines(d / "run" / "journal.jsonl"))
        for replica in REPLICAS:
            own = [x for x in lines(next(d.glob(f"ref-*/logs/{replica}.requests.jsonl")))
                   if x["path"].endswith("completions")]
            at_tap = [a for a in tap if a["replica"] == replica]
            if fault in ("503-storm", "kill") and replica == "tiny-openai-0":  # the proxy answered, or it was dead
                assert len(own) <= len(at_tap) + direct, (c["cell"], replica, len(own), len(at_tap), direct)
            else:
                assert len(own) - direct == len(at_tap), (c["cell"], replica, len(own), len(at_tap), direct)
        agrees_with_own_logs(c, d, summary["load"]["rate"])
    # what these gateways do (pinned versions, chaoskit's settings): nginx never ejects a hung replica (its read
    # timeout is 60 s) and a third of the requests time out; HAProxy keeps picking a replica whose every answer
    # is a 503 (its health check, GET /health, passes) and retries each on the other: two attempts a request
    hang = cells[("nginx", "hang")]["measures"]
    assert hang["time_to_eject_s"] is None and hang["error_rate"] > 0.2, hang
    storm = cells[("haproxy", "503-storm")]["measures"]
    assert storm["time_to_eject_s"] is None and storm["amplification"] > 1.8, storm
    assert (out / "matrix.md").read_text().count("| vllm-router") >= 7
    assert "<table>" in (out / "matrix.html").read_text()


def arrivals(d: Path, replica: str) -> list[float]:
    """When each of the clients' requests reached `replica`, by its own request log: the load's streamed
    completions (the readiness probe and the after phase's direct check are not streamed)."""
    return sorted(x["t0"] for x in lines(next(d.glob(f"ref-*/logs/{replica}.requests.jsonl")))
                  if x["path"] == LOAD_PATH and x["stream"])


def eject_from(at0: list[float], at1: list[float], start: float, stop: float) -> float | None:
    """The time to eject from arrival times at replica 0 and 1: after the last 0.5 s bin where replica 0 had
    more than 5% of the requests, if at least two bins with requests follow."""
    bins = [[0, 0] for _ in range(math.ceil((stop - start) / BIN_S))]
    for k, times in enumerate((at0, at1)):
        for t in (t for t in times if start <= t <= stop):
            bins[min(len(bins) - 1, int((t - start) // BIN_S))][k] += 1
    busy = [(i, r0 > EJECTED * (r0 + r1)) for i, (r0, r1) in enumerate(bins) if r0 + r1]
    first = max((i + 1 for i, bad in busy if bad), default=0)
    return first * BIN_S if sum(i >= first for i, _ in busy) >= 2 else None


def queued(d: Path, replica: str, passed: list[float], stop: float) -> int:
    """How many of the attempts the tap passed to `replica` before `stop` its log starts after it: those passed,
    less the completions its log started before `stop` that came through the tap (all but the readiness probe, which
    goes straight to it). Exact where the replica's log sees every attempt the tap passes it; a replica throttled
    to 5% CPU on a busy box may start some after the revert (one 91 ms after it in a CI run of 786f21f)."""
    own = [x for x in lines(next(d.glob(f"ref-*/logs/{replica}.requests.jsonl"))) if x["path"] == LOAD_PATH]
    n = sum(t < stop for t in passed) - (sum(x["t0"] < stop for x in own) - 1)
    assert n >= 0, (d.name, replica, n)  # more started than the tap passed: the count above is wrong
    return n


def first_after(arrived: list[float], skip: int, stop: float) -> float:
    """When the first attempt the tap passed after `stop` reached the replica (inf: none did), from the replica's
    arrival times: its arrivals after `stop`, less the first `skip` (attempts passed before it)."""
    return min(sorted(t for t in arrived if t >= stop)[skip:], default=math.inf)


def ever(seconds: float | None) -> float:
    return math.inf if seconds is None else seconds  # never ejected: later than any time


def agrees_with_own_logs(c: dict, d: Path, rate: float) -> None:
    """The cell's amplification, time to eject and time to readmit against what the replicas' own request logs
    say, wherever a replica's log can see what the gateway sent it."""
    m, events = c["measures"], lines(d / "run" / "journal.jsonl")
    start = next(e["applied_at"] for e in events if e["event"] == "fault_applied")
    stop = next(e["t"] for e in events if e["event"] == "fault_reverted")
    at0, at1 = arrivals(d, REPLICAS[0]), arrivals(d, REPLICAS[1])
    within = [sum(start <= t <= stop for t in at) for at in (at0, at1)]
    # replica 1 is healthy in every cell: what the tap says the gateway sent it in the fault's span is what it got
    assert abs(m["upstream_attempts"] - m["to_replica0"] - within[1]) <= EDGE, (c["cell"], m, within)
    if c["fault"] == "slow":  # replica 0 serves all it gets, slowly: its log sees every attempt
        assert abs(m["to_replica0"] - within[0]) <= EDGE, (c["cell"], m, within)
        assert abs(m["amplification"] - sum(within) / (rate * m["fault_s"])) <= 2 * EDGE / (rate * m["fault_s"])
        early, late = eject_from([t - LAG for t in at0], at1, start, stop), eject_from(at0, at1, start, stop)
        assert ever(early) <= ever(m["time_to_eject_s"]) <= ever(late), (c["cell"], m, early, late)
    if c["fault"] in ("kill", "503-storm"):  # dead, or the proxy answered: nothing reached replica 0 meanwhile
        assert not [t for t in at0 if start + LAG <= t <= stop], c["cell"]
    # a frozen replica, or one cut off, gets the requests held for it when the revert lets them through: after the
    # revert, sent before it (its log has no arrival times for them); a dead one, or one the proxy answered for, got
    # none of the attempts before the revert; the others start theirs late by the work they had queued
    held = c["fault"] in ("hang", "partition")
    tap = [a for a in lines(next(d.glob("ref-*/logs/tap.requests.jsonl"))) if a["path"] == LOAD_PATH]
    seen = {REPLICAS[1]: at1} if held else {REPLICAS[0]: at0, REPLICAS[1]: at1}
    skip = {r: 0 if c["fault"] in ("kill", "503-storm") and r == REPLICAS[0]
            else queued(d, r, [a["t"] for a in tap if a["replica"] == r], stop) for r in seen}
    # the first request to reach a replica after the revert (the clients' load starts again after it)
    resumed = min(first_after(at, skip[r], stop) for r, at in seen.items())
    assert abs(resumed - stop - m["first_attempt_after_s"]) <= LAG + 1 / rate, (c["cell"], m, resumed - stop)
    if not held:
        back = first_after(at0, skip[REPLICAS[0]], stop) - resumed
        assert math.isinf(back) == (m["time_to_readmit_s"] is None), (c["cell"], m, back)
        assert math.isinf(back) or abs(back - m["time_to_readmit_s"]) <= LAG + 1 / rate, (c["cell"], m, back)


def test_a_matrix_killed_mid_cell_leaves_nothing_applied_and_resume_finishes_it(installed, tmp_path: Path) -> None:
    two = tmp_path / "two.yaml"
    two.write_text(SMALL.read_text().replace("gateways: [vllm-router, nginx, haproxy]", "gateways: [nginx]")
                   .split("  - name: kill")[0])
    out = tmp_path / "m"
    p = subprocess.Popen([sys.executable, "-m", "chaoskit", "matrix", str(two), "--out", str(out)],
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    journal = out / "cells" / "nginx--hang" / "run" / "journal.jsonl"
    try:
        wait_for(lambda: any(x["event"] == "fault_applied" for x in lines(journal)), timeout=120, every=0.2)
        os.killpg(p.pid, signal.SIGKILL)  # the whole job, as a cancelled CI job is
        p.wait(10)
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
    frozen = next(x for x in lines(journal) if x["event"] == "fault_applied")["placement"]["target"]["processes"][0]
    # the cell's watchdog resumes the frozen replica, then takes its deployment down
    wait_for(lambda: not Path(f"/proc/{frozen['pid']}").exists(), timeout=60, every=0.2)
    assert not (out / "cells" / "nginx--hang" / "result.json").exists()
    r = chaoskit("matrix", str(two), "--out", str(out), "--resume", timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    summary = json.loads((out / "matrix.json").read_text())
    assert [c["cell"] for c in summary["cells"]] == ["nginx--hang"]
    assert summary["cells"][0]["measures"]["verdict"] == "deviated"
    again = chaoskit("matrix", str(two), "--out", str(out), timeout=60)
    assert again.returncode == 2 and "--resume" in again.stderr
