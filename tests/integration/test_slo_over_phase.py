"""A continuous slo probe judges every request of a fault's span: `over: phase` once over the whole span, and the
default per-window judging with a final sample of the last partial window; against a real server that answers
every Nth request 500, inside `chaoskit run`."""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
import sys
import urllib.request
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from pydantic import ValidationError

from chaoskit.load.runner import ContinuousLoad
from chaoskit.load.spec import LoadSpec
from chaoskit.probes.slo import SloProbeSpec
from tests.conftest import chaoskit, free_port, write

HELPER = Path(__file__).resolve().parent.parent / "helpers" / "timed_server.py"
DOCS = Path(__file__).resolve().parents[2] / "docs" / "probes.md"

EXPERIMENT = """\
apiVersion: chaoskit/v1
kind: Experiment
metadata: {{name: slo-over-{over}}}
steadyState:
  probes:
    - name: server-up
      type: http
      url: "http://127.0.0.1:{port}/_stats"
      phases: [before, after]
      expect: {{status: 200}}
    - name: share
      type: slo
      mode: continuous
      over: {over}
      window: 1s
      phases: [during]
      load: {{url: "http://127.0.0.1:{port}/gen", rate: 40, duration: 1s, arrival: constant, timeout: 2s,
             sender: {sender}}}
      expect: {{error_rate: "0.15..0.25"}}
  during: {{every: 1s, grace: 0s}}
  after: {{within: 5s, every: 1s}}
method:
  - name: stop-a-bystander
    inject: {{type: process.signal, pid: {pid}, signal: SIGSTOP}}
    duration: 3.5s
"""


@pytest.fixture
def bystander():
    p = subprocess.Popen(["sleep", "120"])
    yield p.pid
    p.kill()
    p.wait()


def _server(every: int) -> tuple[subprocess.Popen, int]:
    port = free_port()
    p = subprocess.Popen([sys.executable, str(HELPER), "errors", str(port), str(every)], stdout=subprocess.PIPE,
                         text=True)
    assert p.stdout and p.stdout.readline().strip() == "ready"
    return p, port


def _stats(port: int) -> dict:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/_stats", timeout=5) as r:
        return json.loads(r.read())


def _run(tmp_path: Path, state: Path, every: int, over: str, sender: str, pid: int,
         experiment: str = EXPERIMENT) -> tuple[int, dict, dict, str]:
    """(exit code, summary.json, the server's counts, output) of one run against a server failing every Nth."""
    server, port = _server(every)
    try:
        exp = write(tmp_path / "e.yaml", experiment.format(port=port, over=over, sender=sender, pid=pid))
        run = chaoskit("run", str(exp), "--out", str(tmp_path / "o"), "--junit", str(tmp_path / "junit.xml"),
                       state=state)
        out, err = run.communicate(timeout=120)
        stats = _stats(port)
    finally:
        server.kill()
        server.wait()
    return run.returncode, json.loads((tmp_path / "o" / "summary.json").read_text()), stats, out + err


def _samples(summary: dict, phase: str) -> list[dict]:
    return sorted((s for s in summary["samples"] if s["probe"] == "share" and s["phase"] == phase),
                  key=lambda s: s["t"])


@pytest.mark.parametrize("sender", ["native", "python"])
def test_over_phase_judges_every_request_of_the_fault_once(tmp_path, state_dir, bystander, sender):
    code, s, stats, out = _run(tmp_path, state_dir, 5, "phase", sender, bystander)
    during, interim = _samples(s, "during"), _samples(s, "interim")
    print(f"\nover: phase ({sender}): server answered {stats}; judged {during[0]['values']['requests']} once, "
          f"interim samples {[x['values']['requests'] for x in interim]}")
    assert code == 0, out
    assert len(during) == 1 and interim, s["samples"]  # one judgment; the samples before it are interim
    v = during[0]["values"]
    # every request the load sent during the fault is judged, the last partial window and those in flight included
    assert v["requests"] == v["sent"] == stats["requests"] > 60, (v, stats)
    assert sum(x["values"]["requests"] for x in interim) < v["requests"]
    assert v["errors.http_status"] == stats["errors"] == stats["requests"] // 5
    assert v["error_rate"] == pytest.approx(stats["errors"] / stats["requests"])
    assert during[0]["verdict"] == "ok" and during[0]["details"][0].startswith("error_rate: ")
    assert v["carried_requests"] == 0


def test_over_phase_deviates_once_when_the_whole_phase_breaks_the_threshold(tmp_path, state_dir, bystander):
    code, s, stats, out = _run(tmp_path, state_dir, 3, "phase", "auto", bystander)
    during = _samples(s, "during")
    assert code == 1, out
    assert len(during) == 1 and during[0]["verdict"] == "fail"
    v = during[0]["values"]
    assert v["requests"] == stats["requests"] and v["errors.http_status"] == stats["requests"] // 3
    share = stats["requests"] // 3 / stats["requests"]
    assert during[0]["details"] == [f"error_rate: {share:g} not in 0.15..0.25"], during[0]["details"]
    assert s["deviations"] == [f"share deviated during the method: error_rate: {share:g} not in 0.15..0.25"]
    assert all(x["verdict"] == "fail" for x in _samples(s, "interim"))  # failing too, but not judged alone
    cases = {c.get("name"): c for c in ET.parse(tmp_path / "junit.xml").iter("testcase")}
    assert cases["during: share"].find("failure") is not None and cases["interim: share"].find("failure") is None


def test_window_mode_judges_the_last_partial_window(tmp_path, state_dir, bystander):
    code, s, stats, out = _run(tmp_path, state_dir, 5, "window", "auto", bystander)
    during = _samples(s, "during")
    assert code == 0, out
    assert not _samples(s, "interim")
    *periodic, final = during
    carried = final["values"]["carried_requests"]
    print(f"\nover: window: server answered {stats}; judged per sample "
          f"{[x['values']['requests'] for x in during]} (the final one carries {carried} of the one before)")
    assert periodic and all("carried_requests" not in x["values"] for x in periodic)
    assert carried in (0, periodic[-1]["values"]["requests"])
    assert sum(x["values"]["requests"] for x in during) - carried == stats["requests"]  # none unjudged
    assert final["values"]["requests"] - carried > 0  # the tail after the last periodic sample
    assert all(x["verdict"] == "ok" for x in during), [x["details"] for x in during]


TWO_FAULTS = EXPERIMENT.replace("    duration: 3.5s\n", """    duration: 2.5s
  - pause: 1.5s
  - name: stop-it-again
    inject: {{type: process.signal, pid: {pid}, signal: SIGSTOP}}
    duration: 2.5s
""").replace("grace: 0s}}", "grace: 0s, between: record}}")  # the pause's samples: recorded, not judged


def test_over_phase_judges_each_span_of_faults_and_stops_after_the_last(tmp_path, state_dir, bystander):
    code, s, stats, out = _run(tmp_path, state_dir, 5, "phase", "auto", bystander, TWO_FAULTS)
    assert code == 0, out
    during, between = _samples(s, "during"), _samples(s, "between")
    print(f"\nover: phase, two faults: server answered {stats}; judged {[x['values']['requests'] for x in during]}, "
          f"between {[x['values']['requests'] for x in between]}")
    assert len(during) == 2 and between, s["samples"]  # one judgment per span, the load ran on between them
    assert all(x["verdict"] == "ok" and x["values"]["requests"] > 20 for x in during)
    assert during[0]["t"] < between[0]["t"] < during[1]["t"]
    faults = sorted(s["faults"], key=lambda f: f["applied_at"])
    assert during[1]["t"] >= faults[1]["applied_at"] + 2.5  # the second one's final sample, at its end
    assert sum(x["values"]["requests"] for x in [*during, *between]) <= stats["requests"]


TRAILING_PAUSE = EXPERIMENT.replace("phases: [during]", "phases: [during, after]").replace(
    "    duration: 3.5s\n", "    duration: 2.5s\n  - pause: 3s\n").replace(
    "grace: 0s}}", "grace: 0s, between: record}}")


def test_a_pause_that_ends_the_method_is_sampled_and_recorded_after_the_revert(tmp_path, state_dir, bystander):
    code, s, stats, out = _run(tmp_path, state_dir, 5, "window", "auto", bystander, TRAILING_PAUSE)
    assert code == 0, out
    reverted = max(f["reverted_at"] for f in s["faults"])
    between = [x for x in _samples(s, "between") if x["t"] > reverted]
    seen = [(round(x["t"] - reverted, 2), x["values"]["requests"]) for x in between]
    print(f"\nafter the revert, in the pause (s after it, requests): {seen}")
    assert between and all(x["values"]["requests"] > 0 for x in between), s["samples"]  # the load went on
    assert all(x["t"] < reverted + 3 for x in between)  # in the pause, not after it
    assert _samples(s, "after")


@pytest.mark.parametrize("sender", ["native", "python"])
def test_a_cut_reports_the_partial_window_and_the_parts_hold_every_request_once(sender):
    server, port = _server(5)
    spec = LoadSpec(url=f"http://127.0.0.1:{port}/gen", rate=50, duration="1s", arrival="constant", timeout="2s",
                    sender=sender)

    async def parts():
        load = ContinuousLoad(spec, 1.0)
        await load.start()
        try:
            first = await load.window(timeout=10)
            await asyncio.sleep(0.5)
            cut = await load.cut(timeout=2)  # half a window: the workers report what they hold now
            after = await load.window(timeout=10)  # at least half a window after the cut
            await load.stop(timeout=2)
            rest = await load.drain(timeout=5)  # what was in flight at the stop, and any window not taken
            return first, cut, after, rest
        finally:
            await load.close()

    try:
        got = asyncio.run(parts())
        stats = _stats(port)
    finally:
        server.kill()
        server.wait()
    reqs = [p.rec.ok + sum(p.rec.errors.values()) for p in got]
    print(f"\ncontinuous load ({sender}): parts {reqs} over {[round(p.elapsed_s, 2) for p in got]} s; server {stats}")
    assert sum(reqs) == sum(p.rec.sent for p in got) == stats["requests"]  # each request in exactly one part
    assert sum(p.rec.errors.get("http_status", 0) for p in got) == stats["errors"]
    first, cut, after, _ = got
    assert first.elapsed_s == 1.0 and reqs[0] == pytest.approx(50, abs=2)
    assert 0.45 < cut.elapsed_s < 0.8 and reqs[1] == pytest.approx(50 * cut.elapsed_s, abs=4)
    assert after.elapsed_s >= 0.5


def _docs_proxy_example() -> str:
    text = DOCS.read_text()
    at = text.index("**Probing through a proxy that exists only during the method.**")
    m = re.search(r"```yaml\n(.*?)```", text[at:], re.S)
    assert m, "the worked example is gone from docs/probes.md"
    return m.group(1)


def test_the_docs_proxy_example_judges_what_the_proxy_counted(tmp_path, state_dir):
    port, proxy_port = free_port(), free_port()
    server = subprocess.Popen([sys.executable, "-m", "tests.helpers.openai_standin", str(port), "m"],
                              stdout=subprocess.PIPE, text=True, cwd=Path(__file__).resolve().parents[2])
    try:
        assert server.stdout and server.stdout.readline().strip() == "ready"
        exp = write(tmp_path / "proxy.yaml", _docs_proxy_example())
        run = chaoskit("run", str(exp), "--out", str(tmp_path / "o"), "--var", f"url=http://127.0.0.1:{port}",
                       "--var", "model=m", "--var", f"proxy_port={proxy_port}", "--var", "duration=5s",
                       state=state_dir)
        out, err = run.communicate(timeout=120)
    finally:
        server.kill()
        server.wait()
    s = json.loads((tmp_path / "o" / "summary.json").read_text())
    events = [json.loads(line) for line in (tmp_path / "o" / "journal.jsonl").read_text().splitlines()]
    proxy = next(e["details"] for e in events if e["event"] == "fault_observed" and e["when"] == "before_revert")
    judged = [x for x in s["samples"] if x["probe"] == "through-proxy" and x["phase"] == "during"]
    direct = [x for x in s["samples"] if x["probe"] == "direct"]
    assert len(judged) == 1, out + err
    v = judged[0]["values"]
    print(f"\ndocs proxy example: the proxy saw {proxy['requests']} requests and aborted "
          f"{proxy['faults']['abort-0']['applied']}; the probe judged {v['requests']}, "
          f"error_share.http_status {v['error_share.http_status']:g} ({judged[0]['verdict']})")
    assert v["requests"] == v["sent"] == proxy["requests"] > 20  # every request through the proxy, judged once
    assert v["errors.http_status"] == proxy["faults"]["abort-0"]["applied"] and v["errors.connect"] == 0
    held = 0.12 <= v["error_share.http_status"] <= 0.28
    assert judged[0]["verdict"] == ("ok" if held else "fail") and run.returncode == (0 if held else 1), out + err
    assert [x["phase"] for x in direct] == ["before", "after"] and all(x["verdict"] == "ok" for x in direct)


def _spec(**kw) -> SloProbeSpec:
    return SloProbeSpec(type="slo", name="s", load={"url": "http://127.0.0.1:1/", "rate": 1, "duration": "1s"},
                        expect={"error_rate": "< 0.1"}, **kw)


def test_over_phase_needs_continuous_mode_and_the_during_phase():
    assert _spec().over == "window" and _spec(mode="continuous", over="phase").over == "phase"
    with pytest.raises(ValidationError, match="over: phase needs mode: continuous"):
        _spec(over="phase")
    with pytest.raises(ValidationError, match=r"over: phase judges the during phase, but phases \(before, after\)"):
        _spec(mode="continuous", over="phase", phases=["before", "after"])
    with pytest.raises(ValidationError, match="over"):
        _spec(mode="continuous", over="run")


STUCK = """\
apiVersion: chaoskit/v1
kind: Experiment
metadata: {{name: requests-judged-where-sent}}
steadyState:
  probes:
    - name: share
      type: slo
      mode: continuous
      window: 1s
      phases: [during, after]
      load: {{url: "http://127.0.0.1:{port}/gen", rate: 20, duration: 1s, arrival: constant, timeout: 5s}}
      expect: {{error_rate: "< 0.01"}}
  during: {{every: 1s}}
  after: {{within: 10s, every: 500ms}}
method:
  - name: freeze-the-server
    inject: {{type: process.signal, pid: {pid}, signal: SIGSTOP}}
    duration: 3s
"""


def test_requests_are_judged_in_the_phase_they_were_sent_in(tmp_path, state_dir):
    """issue 43: the requests a fault held (here: the server itself stopped for 3 s; the load sends from ~1 s in)
    complete after the revert;
    they are the fault's final sample's, and the after phase judges only requests sent after the revert."""
    server, port = _server(10**9)  # answers every request 200
    try:
        exp = write(tmp_path / "e.yaml", STUCK.format(port=port, pid=server.pid))
        run = chaoskit("run", str(exp), "--out", str(tmp_path / "o"), state=state_dir)
        out, err = run.communicate(timeout=120)
        stats = _stats(port)
    finally:
        server.kill()
        server.wait()
    assert run.returncode == 0, out + err
    s = json.loads((tmp_path / "o" / "summary.json").read_text())
    during, after = _samples(s, "during"), _samples(s, "after")
    print(f"\nserver answered {stats}; during all_p99_ms {[x['values'].get('all_p99_ms') for x in during]}, "
          f"after {[x['values'].get('all_p99_ms') for x in after]}, recovered in {s['recovery_s']} s")
    assert during[-1]["values"]["all_p99_ms"] > 1000  # the held requests, judged with the fault
    assert after and all(x["values"]["all_p99_ms"] < 500 for x in after), after  # none of them here
    assert s["recovery_s"] is not None and s["recovery_s"] < 4  # a new load's start (~1 s) and one window
