"""Baseline-relative tolerances and the slo probe's group_by against a real local HTTP server, alone and
inside `chaoskit run`: a server that slows down on SIGUSR1 (a process.signal fault) deviates on
`p99_ms: "< 3x baseline"` and holds when it does not slow down; with answers alternating replica a/b and
only b slowed, `p99_ms[b]` deviates while `p99_ms[a]` holds."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys

import pytest

from chaoskit.probes.slo import SloProbe, SloProbeSpec
from tests.conftest import chaoskit, free_port, write

# PORT BASE_MS SLOW_MS SLOW_S MODE: every answer after BASE_MS; for SLOW_S after a SIGUSR1, after SLOW_MS
# (MODE ab: answers alternate X-Upstream-Replica a / b and only b slows; b-always: b is always slow)
SERVER = r"""
import asyncio, itertools, signal, sys, time
from aiohttp import web
port, base, slow, slow_s, mode = int(sys.argv[1]), float(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4]), sys.argv[5]
state = {"until": 0.0}
turn = itertools.count()

async def handle(request):
    await request.read()
    slowed = time.monotonic() < state["until"] or mode == "b-always"
    headers = {}
    if mode == "plain":
        delay = slow if slowed else base
    else:
        replica = "ab"[next(turn) % 2]
        headers["X-Upstream-Replica"] = replica
        delay = slow if slowed and replica == "b" else base
    await asyncio.sleep(delay / 1e3)
    return web.Response(text="ok", headers=headers)

async def main():
    asyncio.get_running_loop().add_signal_handler(
        signal.SIGUSR1, lambda: state.update(until=time.monotonic() + slow_s))
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", handle)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    print("ready", flush=True)
    await asyncio.Event().wait()

asyncio.run(main())
"""


def start_server(base_ms: float, slow_ms: float, slow_s: float, mode: str) -> tuple[subprocess.Popen, int]:
    port = free_port()
    p = subprocess.Popen([sys.executable, "-c", SERVER, str(port), str(base_ms), str(slow_ms), str(slow_s), mode],
                         stdout=subprocess.PIPE, text=True)
    assert p.stdout and p.stdout.readline().strip() == "ready"
    return p, port


@pytest.fixture
def servers():
    started: list[subprocess.Popen] = []

    def start(*args) -> tuple[subprocess.Popen, int]:
        p, port = start_server(*args)
        started.append(p)
        return p, port

    yield start
    for p in started:
        p.kill()
        p.wait()


EXPERIMENT = """\
apiVersion: chaoskit/v1
kind: Experiment
metadata: {{name: baseline-slo}}
steadyState:
  probes:
    - name: slo
      type: slo
      mode: continuous
      window: 1s
{group_by}      load: {{url: "http://127.0.0.1:{port}/", rate: 20, duration: 1s, arrival: constant, timeout: 5s}}
      expect: {expect}
  during: {{every: 1s}}
  after: {{within: 10s, every: 1s}}
method:
  - inject: {{type: process.signal, pid: {pid}, signal: SIGUSR1}}
    duration: 3s
"""


def run_experiment(tmp_path, state_dir, name: str, **fmt) -> tuple[int, dict, str]:
    exp = write(tmp_path / f"{name}.yaml", EXPERIMENT.format(**{"group_by": "", **fmt}))
    run = chaoskit("run", str(exp), "--out", str(tmp_path / name), state=state_dir)
    out, err = run.communicate(timeout=120)
    return run.returncode, json.loads((tmp_path / name / "summary.json").read_text()), out + err


def details(summary: dict, phase: str, key: str) -> list[str]:
    return [d for s in summary["samples"] if s["phase"] == phase for d in s["details"] if d.startswith(key + ":")]


# base 300 ms (3x baseline >= 900 ms: room for this box's stalls), 2.5 s while slowed (3 s from the signal).
# A window holds 20 requests, so its p99 is its slowest, and latency counts from the intended send: one send
# late on a busy box is the window's p99 (measured here: a before p99 of 439 ms with sends up to 335 ms late; in
# a clean-clone run of cacb172, base 100 ms, a during window of 430 ms against 3 x 109 ms, the fault a no-op).
# The slowdown is large because the baseline is the first window of the load, which can come out slower too.
@pytest.mark.parametrize("slow_ms, code", [(2500, 1), (300, 0)], ids=["slows-down", "stays-fast"])
def test_p99_under_3x_baseline_in_a_real_run(servers, tmp_path, state_dir, slow_ms, code):
    proc, port = servers(300, slow_ms, 3, "plain")
    rc, s, output = run_experiment(tmp_path, state_dir, "run", port=port, pid=proc.pid,
                                   expect='{p99_ms: "< 3x baseline", error_rate: "<= baseline + 0.01"}')
    assert rc == code, output
    before = details(s, "before", "p99_ms")
    assert len(before) == 1 and "baseline measured (later samples: < 3x baseline, 3 x " in before[0]
    baseline = next(x["values"]["p99_ms"] for x in s["samples"] if x["phase"] == "before")
    during = details(s, "during", "p99_ms")
    print(f"\nbaseline p99 {baseline} ms; during: " + " | ".join(during))
    # a window in which no request completed (all still waiting on the slowed server) has no p99 at all
    unanswered = [d for d in during if d.startswith("p99_ms: not measured: no answer completed successfully")]
    judged = [d for d in during if d not in unanswered]
    assert all(f"< 3x baseline (3 x {baseline:g} = {3 * baseline:g})" in d for d in judged)
    if code == 1:
        assert unanswered or any(d.endswith(" is false") for d in judged)
        assert any("slo deviated during the method" in d and "p99_ms" in d for d in s["deviations"])
    else:
        assert not any("is false" in d for d in during + details(s, "after", "p99_ms"))


def test_group_by_replica_in_a_real_run(servers, tmp_path, state_dir):
    proc, port = servers(300, 2500, 3, "ab")  # base 300 ms: as above, room for a late send
    rc, s, output = run_experiment(
        tmp_path, state_dir, "groups", port=port, pid=proc.pid, group_by="      group_by: X-Upstream-Replica\n",
        expect='{"p99_ms[a]": "< 3x baseline", "p99_ms[b]": "< 3x baseline", "requests[a]": "> 0", '
               '"requests[none]": "== 0"}')
    assert rc == 1, output
    a, b = details(s, "during", "p99_ms[a]"), details(s, "during", "p99_ms[b]")
    print("\n" + "\n".join(f"a: {x}\nb: {y}" for x, y in zip(a, b, strict=False)))
    assert a, [(x["phase"], x["details"]) for x in s["samples"]] + s["deviations"]
    assert not any("is false" in d or "not measured" in d for d in a)  # replica a never slowed
    # replica b did: slower than 3x its baseline, or (a window in which b answered nothing) no p99 at all
    b_failed = [d for d in b if d.endswith(" is false") or d.startswith("p99_ms[b]: not measured: no answer from b")]
    assert b_failed
    reasons = [part for d in s["deviations"] for part in d.split("; ")]
    assert any("p99_ms[b]: " in r and r.split("p99_ms[b]: ")[1] in {x.split("p99_ms[b]: ")[1] for x in b_failed}
               for r in reasons)
    assert not any("p99_ms[a]: " in r and r.endswith(" is false") for r in reasons)
    before = next(x["values"] for x in s["samples"] if x["phase"] == "before")
    assert before["requests[a]"] + before["requests[b]"] == before["requests"] and before["requests[none]"] == 0


def test_group_by_breaks_down_a_window_by_the_response_header(servers):
    _, port = servers(5, 100, 0, "b-always")
    spec = SloProbeSpec(type="slo", name="slo", group_by="X-Upstream-Replica",
                        load={"url": f"http://127.0.0.1:{port}/", "rate": 40, "duration": "2s", "arrival": "constant"},
                        expect={"p99_ms[a]": "< 50", "p99_ms[b]": "< 50", "requests[c]": "> 0"})
    v = asyncio.run(SloProbe(spec).measure())
    print(f"\ngroup_by: a p99 {v['p99_ms[a]']} ms ({v['requests[a]']}), b p99 {v['p99_ms[b]']} ms ({v['requests[b]']})")
    assert v["sender"] == "python" and v["requests"] == v["sent"] == 80
    assert v["requests[a]"] == v["requests[b]"] == 40 and v["requests[none]"] == 0
    assert v["requests[c]"] == 0  # named by a tolerance, never answered: a number, not a missing key
    assert v["p50_ms[b]"] >= 100 > v["p50_ms[a]"]  # b answers after 100 ms, a after 5 (medians: this box is shared)
    assert v["p99_ms[b]"] >= 100 and v["error_rate[a]"] == v["error_rate[b]"] == 0


def test_requests_without_an_answer_are_in_group_none():
    port = free_port()  # nothing listens: every request is a connect error, no response head, no replica
    spec = SloProbeSpec(type="slo", name="slo", group_by="X-Upstream-Replica",
                        load={"url": f"http://127.0.0.1:{port}/", "rate": 20, "duration": "1s", "arrival": "constant",
                              "timeout": "1s"})
    v = asyncio.run(SloProbe(spec).measure())
    assert v["requests[none]"] == v["requests"] == 20 and v["error_rate[none]"] == 1.0
    assert v["errors"] == {"connect": 20} and not any(k.endswith("[a]") for k in v)
