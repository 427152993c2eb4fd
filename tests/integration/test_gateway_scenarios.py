"""The bundled gateways/ scenarios on the real routers: each deviates as documented without its fix and holds with
`--var fix=true`, and what the tap counted at replica 0 during the fault agrees, checked against a count made
apart from the verdict's probes (the tap's own log for nginx, llm.proxy's count of the 503s it answered for
HAProxy)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT

SCENARIOS = ROOT / "experiments" / "gateways"

pytestmark = [pytest.mark.root, pytest.mark.timeout(600)]


def chaoskit(*args: str, env: dict[str, str] | None = None, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "chaoskit", *args], capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, "NO_COLOR": "1", **(env or {})})


def events(journal: Path) -> list[dict]:
    return [json.loads(x) for x in journal.read_text().splitlines() if x.strip()]


def fault_window(journal: list[dict]) -> tuple[float, float]:
    applied = next(e for e in journal if e["event"] == "fault_applied")
    reverted = next(e for e in journal if e["event"] == "fault_reverted")
    return applied["applied_at"], reverted["t"]


@pytest.mark.parametrize("name, gateway, fix, expected", [
    ("nginx-hung-replica", "nginx", "false", 1), ("nginx-hung-replica", "nginx", "true", 0),
    ("haproxy-503-replica", "haproxy", "false", 1), ("haproxy-503-replica", "haproxy", "true", 0)])
def test_a_gateway_scenario_flips_with_its_fix(tmp_path: Path, name: str, gateway: str, fix: str,
                                                expected: int) -> None:
    assert re.search(r"^# Expected:", (SCENARIOS / f"{name}.yaml").read_text(), re.MULTILINE)
    installed = chaoskit("ref", "install", f"gateway-{gateway}", timeout=600)
    assert installed.returncode == 0, installed.stderr[-2000:]
    out, ref = tmp_path / "o", tmp_path / "ref"
    p = chaoskit("run", str(SCENARIOS / f"{name}.yaml"), "--var", f"fix={fix}", "--out", str(out), "--plain",
                 env={"CHAOSKIT_REF_DIR": str(ref)})
    assert p.returncode == expected, p.stdout[-4000:] + p.stderr[-2000:]
    journal = events(out / "journal.jsonl")
    start, end = fault_window(journal)
    tap_log = next(tmp_path.glob("ref-*/logs/tap.requests.jsonl"))  # the run's deployment: CHAOSKIT_REF_DIR + its hash
    taps = [json.loads(x) for x in tap_log.read_text().splitlines()]
    during = [t for t in taps if start <= t["t"] <= end and t["path"] == "/v1/completions"]
    to_0 = [t for t in during if t["replica"] == "tiny-openai-0"]
    print(f"\n{name} fix={fix}: {len(during)} attempts during the fault, {len(to_0)} to replica 0")
    if name == "nginx-hung-replica":
        # without the fix nginx keeps giving the frozen replica its round-robin share for the whole fault; with it,
        # only until the first read timeout (1 s), which marks it failed for the rest of the fault (10 s)
        late = [t for t in to_0 if t["t"] > start + 1.5]
        assert (len(late) > 0.3 * len(during)) if expected else (to_0 and not late), (len(late), len(to_0))
        return
    # llm.proxy's own count of the 503s it answered (a process apart from the tap) agrees with the tap's
    observed = [e["details"] for e in journal if e["event"] == "fault_observed" and e.get("type") == "llm.proxy"]
    aborted = sum(f["applied"] for f in observed[-1]["faults"].values()) if observed else None
    assert aborted is not None and abs(aborted - len(to_0)) <= 2, (observed, len(to_0))
    # after the 3 s grace: every client request first to replica 0 (20/s), or only the active checks (1/s)
    late = [t for t in to_0 if t["t"] > start + 3.0]
    span = end - start - 3.0
    assert (len(late) > 15 * span) if expected else (len(late) <= 1.5 * span + 1), (len(late), span)
