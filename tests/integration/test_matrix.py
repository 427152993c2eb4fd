"""`chaoskit matrix` on real gateways (vLLM Router, nginx, HAProxy) and real faults of replica 0: every cell gets
a verdict and its measures, checked against what the replicas' own request logs counted; a matrix killed
mid-cell leaves nothing applied and --resume finishes it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT, wait_for

SMALL = ROOT / "tests" / "fixtures" / "matrix-small.yaml"
GATEWAYS = ("vllm-router", "nginx", "haproxy")

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
        assert m["amplification"] is not None and m["fault_s"] >= 4.0, (c["cell"], m)
        # the tap's count of what reached each replica against the replicas' own logs, over the whole cell
        tap = [a for a in lines(next(d.glob("ref-*/logs/tap.requests.jsonl"))) if a["path"].endswith("completions")]
        for replica in ("tiny-openai-0", "tiny-openai-1"):
            own = [x for x in lines(next(d.glob(f"ref-*/logs/{replica}.requests.jsonl")))
                   if x["path"].endswith("completions")]
            at_tap = [a for a in tap if a["replica"] == replica]
            # two completions go straight to a replica, so only its own log has them: the readiness probe at the
            # start and the after phase's check that it still serves
            if fault in ("503-storm", "kill") and replica == "tiny-openai-0":  # the proxy answered, or it was dead
                assert len(own) <= len(at_tap) + 2, (c["cell"], replica, len(own), len(at_tap))
            else:
                assert len(own) - 2 == len(at_tap), (c["cell"], replica, len(own), len(at_tap))
    # what these gateways do (pinned versions, chaoskit's settings): nginx never ejects a hung replica (its read
    # timeout is 60 s) and a third of the requests time out; HAProxy keeps picking a replica whose every answer
    # is a 503 (its health check, GET /health, passes) and retries each on the other: two attempts a request
    hang = cells[("nginx", "hang")]["measures"]
    assert hang["time_to_eject_s"] is None and hang["error_rate"] > 0.2, hang
    storm = cells[("haproxy", "503-storm")]["measures"]
    assert storm["time_to_eject_s"] is None and storm["amplification"] > 1.8, storm
    assert (out / "matrix.md").read_text().count("| vllm-router") >= 7
    assert "<table>" in (out / "matrix.html").read_text()


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
