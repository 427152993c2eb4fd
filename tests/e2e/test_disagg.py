"""The bundled disagg/ scenarios (issue 36): tiny_lm split into prefill and decode servers with its KV cache handed
over a TCP side channel, the gateway as the PD router. Each ends with exactly its documented exit code without
and with `--var fix=true`, the decode slots the waiting requests hold are measured, and nothing is left running
(the run brings its deployment up and takes it down)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest

from chaoskit.reference.deploy import Deployment
from chaoskit.reference.scenario import free_port_block
from chaoskit.targets.process import ProcessRef, is_alive
from tests.conftest import ROOT, chaoskit
from tests.helpers.survivors import survivors

SCENARIOS = ROOT / "experiments" / "disagg"


def _stuck(summary: dict, phase: str) -> list[float]:
    return [s["values"]["value"] for s in summary["samples"]
            if s["probe"] == "decode-slots-stuck" and s["phase"] == phase and s["values"].get("value") is not None]


def _rooms_waiting(tmp_path: Path, p: subprocess.Popen) -> tuple[str, str, list[int]]:
    """The run's output, once it has ended, and what the decode server itself counted meanwhile (read by the test
    every 0.2 s from its /metrics, not from chaoskit): its KV transfers still waiting for their done notification
    (tiny_lm_pd_rooms_waiting: bootstrapped, bytes maybe all there, no done yet)."""
    out: list = []

    def read() -> None:
        try:
            out.extend(p.communicate(timeout=180))
        except subprocess.TimeoutExpired as e:
            out.append(e)

    reader = threading.Thread(target=read)
    reader.start()
    seen = []
    while reader.is_alive():
        facts = next((f for d in tmp_path.glob("ref*") if (f := Deployment(d).facts())), None)
        if facts and facts.get("decode_url"):
            try:
                with urllib.request.urlopen(f"{facts['decode_url']}/metrics", timeout=1) as r:
                    seen += [int(float(line.split()[-1])) for line in r.read().decode().splitlines()
                             if line.startswith("tiny_lm_pd_rooms_waiting")]
            except OSError:
                pass  # not up yet, or down already
        time.sleep(0.2)
    reader.join()
    if isinstance(out[0], Exception):
        p.kill()
        raise out[0]
    return out[0], out[1], seen


ROOT_ONLY = pytest.mark.skipif(os.geteuid() != 0, reason="the decode server's own network namespace needs root")


@pytest.mark.parametrize("name, fix, expected", [
    ("abort-not-notified", "false", 1), ("abort-not-notified", "true", 0),
    ("prefill-killed-mid-transfer", "false", 1), ("prefill-killed-mid-transfer", "true", 0),
    pytest.param("notification-lost", "false", 1, marks=ROOT_ONLY),
    pytest.param("notification-lost", "true", 0, marks=ROOT_ONLY),
    pytest.param("kv-corrupted-silently", "false", 1, marks=ROOT_ONLY),
    pytest.param("kv-corrupted-silently", "true", 0, marks=ROOT_ONLY)])
def test_a_disaggregated_scenario_flips_with_its_fix(tmp_path, state_dir, name, fix, expected):
    assert re.search(r"^# Expected:", (SCENARIOS / f"{name}.yaml").read_text(), re.MULTILINE)
    p = chaoskit("run", str(SCENARIOS / f"{name}.yaml"), "--var", f"fix={fix}", "--out", str(tmp_path / "o"),
                 "--plain", state=state_dir, env={"CHAOSKIT_REF_DIR": str(tmp_path / "ref")})
    if name == "notification-lost":
        out, err, waiting = _rooms_waiting(tmp_path, p)
    else:
        out, err = p.communicate(timeout=180)
    assert p.returncode == expected, out + err
    s = json.loads((tmp_path / "o" / "summary.json").read_text())
    if name == "kv-corrupted-silently":
        _silent(s, expected)
        return
    after = _stuck(s, "after")
    print(f"\n{name} fix={fix}: decode slots stuck (waiting over 1 s for KV) after the faults {after}, "
          f"recovered {s.get('recovery_s')} s")
    assert _stuck(s, "before") == [0.0]
    stuck_floor = 6  # the slots stay stuck with requests whose KV never comes, the whole after phase (one may free
    if name == "notification-lost":  # for a moment and be taken by the next request)
        seen = [e["details"] for e in map(json.loads, (tmp_path / "o" / "journal.jsonl").read_text().splitlines())
                if e.get("event") == "fault_observed" and e.get("type") == "kv.notify" and "dropped" in e["details"]]
        print(f"kv.notify: {seen[-1] if seen else None}; the decode server's rooms waiting for their done "
              f"notification, most at once: {max(waiting, default=None)}")
        assert seen and 0 < seen[-1]["dropped"] < seen[-1]["notifications"], seen  # its own counts
        # The floor from what the decode server counted, not from kv.notify's own count: a transfer whose done
        # notification it never got holds its request's slot past the after phase (20 s); its rooms also count
        # requests that found no free slot, hence at most the 8 slots; one may free for a moment and be taken by the
        # next request. Without the fix some must have been lost (measured: 17 rooms, kv.notify said 17 dropped).
        lost = max(waiting, default=0)
        assert expected == 0 or lost > 0, waiting
        stuck_floor = max(1, min(8, lost) - 1)
    if expected == 1:
        assert after and all(v >= stuck_floor for v in after), after
    else:
        assert after[-1] < 2 and s["recovery_s"] is not None
    assert survivors(tmp_path / "ref") == [], out + err  # the process list's (`down` empties the records)
    ours = tuple(f"ckref{Deployment(d).tag}-" for d in tmp_path.glob("ref*"))
    assert not [n for n in (os.listdir("/run/netns") if os.path.isdir("/run/netns") else []) if n.startswith(ours)]


def _silent(s: dict, expected: int) -> None:
    """kv-corrupted-silently: the load's SLO holds in every sample either way; without the fix the correctness
    probe catches wrong answers (mismatches: HTTP 200, well formed, other tokens), with it not one."""
    samples = [x for x in s["samples"] if x["phase"] in ("before", "during", "after")]
    mismatches = sum(x["values"].get("failures.mismatch", 0) for x in samples
                     if x["probe"] == "answers-through-gateway")
    print(f"\nkv-corrupted-silently: {mismatches} wrong answers caught")
    failed = [x for x in samples if x["probe"] == "sla-through-gateway" and x["verdict"] != "ok"]
    assert not failed, failed
    assert (mismatches > 0) == (expected == 1), mismatches


def test_ref_up_disaggregated_serves_through_prefill_and_decode_and_down_leaves_nothing(tmp_path, state_dir):
    """`ref up --disaggregated 2:1`: the facts name the servers; a request through the gateway is prefilled on a
    prefill server, its KV handed to the decode server (the decode's counters say so), and its answer is the one
    the decode server gives when it prefills itself."""
    import urllib.request

    port, ref, pids = free_port_block(3), tmp_path / "ref", []  # a free block: the gateway's and 3 ports per server
    up = chaoskit("ref", "up", "--disaggregated", "2:1", "--port", str(port), "--json", "--dir", str(ref),
                  state=state_dir)
    out, err = up.communicate(timeout=120)
    try:
        assert up.returncode == 0, out + err
        facts = json.loads(out)
        pids = [ProcessRef.from_json(p) for p in Deployment(ref).processes()]
        assert facts["engine"] == "tiny_lm-pd" and [r["name"] for r in facts["replicas"]] == [
            "decode-0", "prefill-0", "prefill-1"] and facts["prefill_pids"] == [r["pid"] for r in facts["replicas"][1:]]

        def ask(url: str) -> str:
            body = json.dumps({"model": "tiny_lm", "prompt": "disaggregated serving", "max_tokens": 8}).encode()
            req = urllib.request.Request(url + "/v1/completions", data=body, headers={"Content-Type": "application/json"})
            with urllib.request.urlopen(req, timeout=10) as r:
                return json.loads(r.read())["choices"][0]["text"]

        through_pd, local = ask(facts["url"]), ask(facts["decode_url"])
        with urllib.request.urlopen(facts["decode_url"] + "/health", timeout=5) as r:
            health = json.loads(r.read())
        assert through_pd == local and len(local) == 8
        assert health["transfers_done"] >= 2 and health["requests_recomputed"] == 0  # readiness + this request
    finally:
        subprocess.run([sys.executable, "-m", "chaoskit", "ref", "down", "--dir", str(ref)], cwd=ROOT,
                       capture_output=True, timeout=60)
    assert len(pids) == 4 and not any(is_alive(p) for p in pids)  # three servers and the gateway
