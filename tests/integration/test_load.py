"""The open-loop load generator against local servers with known timing (real sockets)."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

import pytest

from chaoskit.load.runner import run_load
from chaoskit.load.spec import LoadSpec
from tests.conftest import ROOT, free_port

HELPER = Path(__file__).resolve().parent.parent / "helpers" / "timed_server.py"


@pytest.fixture
def server():
    procs = []

    def start(*args: str) -> int:
        port = free_port()
        p = subprocess.Popen([sys.executable, str(HELPER), args[0], str(port), *args[1:]], stdout=subprocess.PIPE,
                             text=True)
        assert p.stdout and p.stdout.readline().strip() == "ready"
        procs.append(p)
        return port

    yield start
    for p in procs:
        p.kill()
        p.wait()


def test_coordinated_omission_corrected_p99_matches_the_analytic_value(server, load_sender):
    """Constant 200/s; the server stalls S = 0.5 s every T = 2 s. A request arriving in a stall waits for its
    end: latency uniform on (0, S] for a share S/T of requests, so p99 = S - 0.01 T = 0.48 s. With a
    concurrency cap of 16 the sender cannot send during a stall: measured from the actual send, the stall
    mostly disappears (the uncorrected numbers); measured from the intended send it does not."""
    s, t = 0.5, 2.0
    port = server("stall", str(s), str(t))
    summary = asyncio.run(run_load(LoadSpec(url=f"http://127.0.0.1:{port}/", rate=200, duration=4 * t,
                                            arrival="constant", concurrency_cap=16, sender=load_sender)))
    analytic = s - 0.01 * t
    corrected, uncorrected = summary["p99_ms"] / 1e3, summary["service_p99_ms"] / 1e3
    error = abs(corrected - analytic) / analytic
    print(f"\nstall {s}s every {t}s at 200/s, cap 16: p99 analytic {analytic * 1e3:.0f} ms, CO-corrected "
          f"{corrected * 1e3:.1f} ms (error {error:.2%}), uncorrected {uncorrected * 1e3:.1f} ms; p90 analytic "
          f"{(s - 0.1 * t) * 1e3:.0f} ms, corrected {summary['p90_ms']:.1f} ms, uncorrected "
          f"{summary['service_p90_ms']:.1f} ms")
    assert summary["error_rate"] == 0
    assert error < 0.05
    # only the 16 requests in flight when a stall starts see it from their actual send: 4% of sends, so the
    # uncorrected p90 hides the stall that a quarter of the users felt
    assert summary["service_p90_ms"] < 0.2 * summary["p90_ms"]


def test_streaming_ttft_and_itl_match_the_server_timing(server, load_sender):
    port = server("sse", "40", "15", "12")
    summary = asyncio.run(run_load(LoadSpec(url=f"http://127.0.0.1:{port}", api="openai", model="m", rate=5,
                                            duration=2, arrival="constant", max_tokens=12, sender=load_sender)))
    print(f"\nSSE server TTFT 40 ms, ITL 15 ms: measured TTFT p50 {summary['ttft_p50_ms']:.2f} ms, "
          f"ITL p50 {summary['itl_p50_ms']:.2f} ms, TPOT p50 {summary['tpot_p50_ms']:.2f} ms")
    assert summary["ok"] == 10 and summary["output_tokens"] == 120
    assert abs(summary["ttft_p50_ms"] - 40) <= 2
    assert abs(summary["itl_p50_ms"] - 15) <= 2
    assert abs(summary["tpot_p50_ms"] - 15) <= 2


def test_goodput_counts_only_requests_meeting_every_slo(server):
    port = server("sse", "40", "15", "4")
    common = {"url": f"http://127.0.0.1:{port}", "api": "openai", "model": "m", "rate": 10, "duration": 1,
              "arrival": "constant", "max_tokens": 4}
    met = asyncio.run(run_load(LoadSpec(**common, slo={"ttft": "100ms", "e2e": "200ms"})))
    missed = asyncio.run(run_load(LoadSpec(**common, slo={"ttft": "20ms"})))
    assert met["goodput_rps"] == pytest.approx(10, abs=0.5) and missed["goodput_rps"] == 0


def test_several_workers_merge_their_histograms(server, load_sender):
    port = server("stall", "0", "1")
    summary = asyncio.run(run_load(LoadSpec(url=f"http://127.0.0.1:{port}/", rate=300, duration=2,
                                            arrival="poisson", workers=2, sender=load_sender)))
    assert summary["workers"] == 2 and summary["ok"] == summary["sent"] > 450
    # every answer of both workers is in the merged histograms, once (not one worker's, not twice)
    hists = summary["recorder"].hists
    assert hists["e2e"].get_total_count() == hists["service"].get_total_count() == summary["ok"]
    assert summary["p50_ms"] < 50


def test_cli_bad_input_is_a_clear_error():
    for args, text in ((["--rate", "-1"], "--rate"), (["--api", "grpc", "--rate", "1"], "--api"),
                       (["--rate", "1", "--slo", "ttft"], "METRIC:LIMIT")):
        r = subprocess.run([sys.executable, "-m", "chaoskit", "load", "http://127.0.0.1:1/", *args], cwd=ROOT,
                           capture_output=True, text=True, timeout=60)
        assert r.returncode == 2 and text in r.stderr and "Traceback" not in r.stderr


def test_cli_unreachable_url_is_a_clean_failure_report(tmp_path):
    r = subprocess.run([sys.executable, "-m", "chaoskit", "load", f"http://127.0.0.1:{free_port()}/", "--rate", "20", "--arrival", "constant",
                        "--duration", "1s", "--json", str(tmp_path / "s.json")], cwd=ROOT, capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 1 and "Traceback" not in r.stderr and "connect" in r.stderr
    assert json.loads((tmp_path / "s.json").read_text())["errors"] == {"connect": 20}


def test_a_server_that_hangs_up_before_answering_is_counted_not_crashed(load_sender):
    """Every connection is accepted, the request read, then closed with no reply: each request is an error of
    class `other`, and the run ends on time (a protocol callback that raised used to stall the worker)."""
    import socket

    from tests.helpers.netpair import serve_in_threads

    def hang_up(c: socket.socket) -> None:
        with c:
            c.recv(65536)

    srv = socket.create_server(("127.0.0.1", 0))
    port, stop = srv.getsockname()[1], serve_in_threads(srv, hang_up)
    try:
        s = asyncio.run(run_load(LoadSpec(url=f"http://127.0.0.1:{port}/v1", api="openai", model="m", rate=50,
                                          duration=1, arrival="constant", timeout=3, sender=load_sender)))
    finally:
        stop()
    assert s["ok"] == 0 and s["errors"] == {"other": 50}


def _in_process(spec: LoadSpec) -> dict:
    """A constant-rate run of `spec` by its sender in this process (no worker start-up): the summary."""
    import time

    from chaoskit.load import generator
    from chaoskit.load.fastclient import request_bytes
    from chaoskit.load.native import Sender
    from chaoskit.load.recorder import Recorder

    rec, n = Recorder(), round(spec.rate * spec.duration)
    offsets, start = [i / spec.rate for i in range(n)], time.time() + 0.05
    if spec.sender == "python":
        asyncio.run(generator.run(spec, offsets, start, rec))
    else:
        sender = Sender(spec, [request_bytes(*r, None) for r in generator.requests(spec)], rec)
        try:
            sender.run(offsets, time.monotonic() + (start - time.time()), lambda: None)
            sender.sync()
        finally:
            sender.close()
    return rec.summary(spec.rate, spec.duration, n)


def test_all_requests_percentiles_count_timeouts_at_the_timeout(server, load_sender):
    """Every 2nd request is never answered: the successes-only p99 stays that of a fast server, the
    all-requests p99 (all_p99_ms) is at least the 0.3 s timeout, so the failures cannot hide."""
    port = server("hang", "2")
    s = _in_process(LoadSpec(url=f"http://127.0.0.1:{port}/", rate=100, duration=0.5, arrival="constant",
                             timeout=0.3, sender=load_sender))
    print(f"\n{load_sender}: error_rate {s['error_rate']:.2f}, p99_ms {s['p99_ms']}, all_p99_ms {s['all_p99_ms']}, "
          f"all_p50_ms {s['all_p50_ms']}")
    assert s["sent"] == 50 and 0.45 <= s["error_rate"] <= 0.55 and set(s["errors"]) == {"timeout"}
    assert s["p99_ms"] < 100 and s["all_p99_ms"] >= 300 and s["all_p90_ms"] >= 300
    assert "all_ttft_p99_ms" not in s  # nothing streamed: no TTFT of any request
