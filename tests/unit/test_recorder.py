"""The load recorder's bulk path puts every value in the same HDR bucket as HdrHistogram.record_value."""

from __future__ import annotations

import json
import random
import subprocess
import sys

import numpy as np

from chaoskit.load.recorder import HIGHEST, LOWEST, Recorder, _hist, _sync, add
from chaoskit.load.schedule import ScheduleClock, offsets


def test_direct_counting_matches_record_value_bucket_for_bucket():
    rng = random.Random(7)
    seconds = [rng.lognormvariate(-7, 3) for _ in range(20000)] + [0.0, -1.0, 1e-7, 3599.99, 1e6, 0.0010005]
    one, bulk = _hist(), _hist()
    for s in seconds:
        one.record_value(min(HIGHEST, max(LOWEST, round(s * 1e6))))
        add(bulk.counts, s)
    _sync(bulk)
    assert np.array_equal(np.ctypeslib.as_array(one.counts), np.ctypeslib.as_array(bulk.counts))
    assert one.total_count == bulk.total_count
    assert one.values_are_equivalent(one.min_value, bulk.min_value)
    assert one.values_are_equivalent(one.max_value, bulk.max_value)
    for q in (50, 90, 99, 99.9, 100):
        assert one.get_value_at_percentile(q) == bulk.get_value_at_percentile(q)


def test_buffered_values_are_seen_by_summaries_and_merges():
    a, b = Recorder(), Recorder()
    for i in range(1, 1001):
        a.sent_at(0.002 if i % 100 == 0 else 0.0001)
        a.success(i / 1e3, i / 2e3, 0.0005, [0.001, 0.002], 3, True)
    b.merge(a.to_json())
    s = b.summary(1000, 1.0, scheduled=1000)
    assert s["ok"] == 1000 and s["late_sends"] == 10 and s["max_late_ms"] == 2.0
    assert abs(s["p50_ms"] - 500) <= 0.5 and abs(s["service_p99_ms"] - 495) <= 0.5
    assert s["itl_p50_ms"] == 1.0 and b.hists["itl"].get_total_count() == 2000
    assert b.hists["tpot"].get_total_count() == 1000


def test_native_sender_counts_in_the_same_buckets():
    """sender.c's copy of `add`, through the histograms the recorder shares with it."""
    from chaoskit.load import native
    from chaoskit.load.recorder import METRICS
    from chaoskit.load.spec import LoadSpec
    from tests.conftest import native_sender_or_skip

    native_sender_or_skip()
    rng = random.Random(11)
    seconds = [rng.lognormvariate(-7, 3) for _ in range(20000)] + [0.0, -1.0, 1e-7, 3599.99, 1e6, 0.0010005]
    rec, expect = Recorder(), _hist()
    sender = native.Sender(LoadSpec(url="http://127.0.0.1:9/", rate=1, duration=1), [b"GET / HTTP/1.1\r\n\r\n"], rec)
    try:
        for s in seconds:
            sender.lib.ck_add(sender.h, METRICS.index("itl"), s)
            add(expect.counts, s)
    finally:
        sender.close()
    assert np.array_equal(np.ctypeslib.as_array(rec.counts("itl")), np.ctypeslib.as_array(expect.counts))
    assert rec.hists["itl"].get_total_count() == len(seconds) and rec.hists["e2e"].get_total_count() == 0


def test_reset_zeroes_in_place():
    rec = Recorder()
    counts = rec.counts("e2e")
    rec.sent_at(0.002)
    rec.success(0.01, 0.01, None, [], 1, True)
    rec.failure("timeout")
    rec.reset()
    assert rec.counts("e2e") is counts and not any(counts)
    assert rec.summary(1, 1, scheduled=1)["sent"] == 0 and rec.hists["e2e"].get_total_count() == 0 and rec.errors == {}


def test_schedule_clock_counts_each_window_once():
    times = offsets("poisson", 50, 10, seed=3)
    clock = ScheduleClock(iter(times))
    counts = [clock.due_before(t) for t in (1, 2, 2, 5, 100)]
    assert counts == [sum(1 for x in times if lo <= x < hi) for lo, hi in ((0, 1), (1, 2), (2, 2), (2, 5), (5, 100))]
    assert sum(counts) == len(times)


def test_ratios_divide_by_the_schedule_not_by_rate_times_duration():
    rec = Recorder()
    for _ in range(30):
        rec.sent_at(0.0)
    for _ in range(27):
        rec.success(0.01, 0.01, None, [], 1, True)
    s = rec.summary(20, 2.0, scheduled=30)
    assert s["completed_ratio"] == 0.9 and s["sent_on_time_ratio"] == 1.0 and s["completed_rps"] == 13.5
    assert rec.summary(20, 2.0, scheduled=0)["completed_ratio"] == 1.0  # nothing was due: nothing missed
    assert rec.summary(20, 2.0, scheduled=20)["completed_ratio"] == 1.0  # answers to the window before: capped


def test_auto_picks_the_native_sender_for_http_where_a_compiler_exists():
    """`sender: auto` must not fall back to python silently where the native sender can be built: a sender.c
    that no longer compiles fails here instead of every benchmark measuring the python sender."""
    from chaoskit.load import native
    from chaoskit.load.spec import LoadSpec
    from tests.conftest import native_sender_or_skip

    native_sender_or_skip()
    assert native.choose(LoadSpec(url="http://127.0.0.1:9", api="openai", model="m", rate=1, duration=1)) == "native"
    assert native.choose(LoadSpec(url="https://127.0.0.1:9", api="openai", model="m", rate=1, duration=1)) == "python"


def test_all_requests_percentiles_count_a_failure_at_its_timeout_or_later():
    """Successes go to both views; a failure only to all_* (and all_ttft when the run streams), at what
    failed_at says: its timeout, or its time if later. Groups and merges carry them like the others."""
    from chaoskit.load.recorder import failed_at

    rec = Recorder()
    for i in range(100):
        if i % 2:
            rec.failure("timeout", failed_at(2.0, 0.5 if i < 90 else 3.0), streamed=True)
        else:
            rec.success(0.01, 0.01, 0.005, [], 1, True)
    merged = Recorder()
    merged.merge(rec.to_json())
    s = merged.summary(100, 1.0, scheduled=100)
    assert s["p99_ms"] < 11 and s["ttft_p99_ms"] < 6 and s["error_rate"] == 0.5
    assert s["all_p50_ms"] < 11 and 2000 <= s["all_p90_ms"] < 2010 and s["all_p99_ms"] >= 3000
    assert s["all_ttft_p50_ms"] < 6 and s["all_ttft_p90_ms"] == s["all_p90_ms"] and s["all_ttft_p99_ms"] >= 3000
    plain = Recorder()
    plain.failure("connect", 1.0)  # not streamed: no TTFT for it; and a kind alone counts in no histogram
    plain.failure("other")
    assert "all_ttft_p50_ms" not in plain.summary(1, 1, 2) and plain.hists["all_e2e"].get_total_count() == 1


# A sender process's first window report used to import numpy (and run hdrh's encoder for the first time) while
# it sent: the first window after it had sends 24-63 ms late where every other one had < 1 ms.
FIRST_REPORT = """
import json, sys
from chaoskit.load import worker
from chaoskit.load.recorder import Recorder

loaded = []
worker._asyncio = lambda *a, **k: None
worker.run_fast = lambda _: loaded.append(set(sys.modules))  # where the sending would start
sys.stdin = open(sys.argv[1])
worker.main()
rec = Recorder()
rec.sent_at(0.0)
rec.success(0.2, 0.2, None, [], 0, True)
rec.failure("timeout", 1.0, False)
rec.to_json()
print(json.dumps(sorted(set(sys.modules) - loaded[0])))
"""


def test_a_sender_loads_what_its_window_reports_need_before_it_sends(tmp_path):
    job = tmp_path / "job.json"
    job.write_text(json.dumps({"spec": {"url": "http://127.0.0.1:9/", "rate": 10, "duration": "1s",
                                        "sender": "python"},
                               "start_epoch": 0, "worker": 0, "workers": 1, "window_s": 1.0}) + "\n")
    out = subprocess.run([sys.executable, "-c", FIRST_REPORT, str(job)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout.splitlines()[-1]) == []
