"""A run against the real Prometheus, Alertmanager and Pushgateway (Debian's), each started on a loopback port and
stopped after: Prometheus scrapes the run's --metrics-port and evaluates rules on chaoskit_fault_active, the alert
probe reads the alerts back (from Prometheus and from Alertmanager) and the report gives the time to detect."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import tempfile
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.conftest import chaoskit, free_port, write

BINARIES = ("prometheus", "prometheus-alertmanager", "prometheus-pushgateway")
pytestmark = pytest.mark.skipif(any(shutil.which(b) is None for b in BINARIES),
                                reason="needs Debian's prometheus, prometheus-alertmanager, prometheus-pushgateway "
                                       "(scripts/setup.sh installs them)")
RULES = """\
groups:
  - name: chaoskit
    interval: 1s
    rules:
      - alert: ChaosFault
        expr: max by (experiment) (chaoskit_fault_active) == 1
      - alert: NeverFires
        expr: max by (experiment) (chaoskit_fault_active) > 1
      - alert: SlowToFire
        expr: max by (experiment) (chaoskit_fault_active) == 1
        for: 10s
"""


@dataclass(frozen=True)
class Stack:
    metrics_port: int  # where each run serves --metrics-port (Prometheus scrapes it every second)
    prometheus: str
    alertmanager: str
    pushgateway: str


def _get(url: str, timeout: float = 2.0) -> bytes:
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return r.read()


def _ready(url: str, proc: subprocess.Popen, timeout: float = 20.0) -> None:
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        assert proc.poll() is None, f"{proc.args[0]} exited {proc.returncode}"
        try:
            _get(url + "/-/ready")
            return
        except OSError:
            time.sleep(0.1)
    raise AssertionError(f"{url} not ready within {timeout}s")


def _scraping(prometheus: str, timeout: float = 20.0) -> None:
    """Until Prometheus has scraped the run's port once (down: no run yet); it applies its targets only every
    5 s after start, so a run started at once would be seen seconds late."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        targets = json.loads(_get(f"{prometheus}/api/v1/targets"))["data"]["activeTargets"]
        if targets and targets[0]["health"] != "unknown":
            return
        time.sleep(0.2)
    raise AssertionError(f"Prometheus did not scrape within {timeout}s")


def _configs(d: Path, metrics: int, am: int) -> Path:
    write(d / "rules.yml", RULES)
    write(d / "am.yml", "route: {receiver: blackhole}\nreceivers: [{name: blackhole}]\n")
    return write(d / "prom.yml", f"""\
global: {{scrape_interval: 1s, evaluation_interval: 1s}}
rule_files: [{d / 'rules.yml'}]
alerting:
  alertmanagers: [{{static_configs: [{{targets: ['127.0.0.1:{am}']}}]}}]
scrape_configs:
  - job_name: chaoskit
    static_configs: [{{targets: ['127.0.0.1:{metrics}']}}]
""")


@pytest.fixture(scope="module")
def stack() -> Iterator[Stack]:
    metrics, prom, am, pg = (free_port() for _ in range(4))
    with tempfile.TemporaryDirectory(prefix="chaoskit-observe-") as tmp:
        d = Path(tmp)
        cfg = _configs(d, metrics, am)
        procs = [subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) for argv in (
            ["prometheus-alertmanager", f"--config.file={d / 'am.yml'}", f"--storage.path={d / 'am'}",
             f"--web.listen-address=127.0.0.1:{am}", "--cluster.listen-address="],
            ["prometheus-pushgateway", f"--web.listen-address=127.0.0.1:{pg}", "--persistence.file="],
            ["prometheus", f"--config.file={cfg}", f"--storage.tsdb.path={d / 'tsdb'}",
             f"--web.listen-address=127.0.0.1:{prom}"])]
        try:
            urls = [f"http://127.0.0.1:{p}" for p in (am, pg, prom)]
            for url, proc in zip(urls, procs, strict=True):
                _ready(url, proc)
            _scraping(urls[2])
            yield Stack(metrics, urls[2], urls[0], urls[1])
        finally:
            for proc in procs:
                proc.terminate()
            for proc in procs:
                try:
                    proc.wait(10)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()


def experiment(name: str, pid: int, probes: str, fault_s: float = 4, after_s: float = 15) -> str:
    return f"""\
apiVersion: chaoskit/v1
kind: Experiment
metadata: {{name: {name}}}
steadyState:
  probes:
{probes}
  during: {{every: 0.25s}}
  after: {{within: {after_s}s, every: 0.25s}}
method:
  - name: freeze
    inject: {{type: process.signal, pid: {pid}, signal: SIGSTOP}}
    duration: {fault_s}s
"""


def alert_probe(name: str, url: str, alert: str, experiment: str, source: str = "prometheus",
                detect: str = "8s", resolve: str = "10s") -> str:
    return f"""\
    - name: {name}
      type: alert
      source: {source}
      url: {url}
      alerts: [{{name: {alert}, labels: {{experiment: {experiment}}}}}]
      detect_within: {detect}
      resolve_within: {resolve}
"""


def run(tmp: Path, name: str, text: str, state: Path, *opts: str) -> tuple[int, dict, str]:
    exp = write(tmp / f"{name}.yaml", text)
    proc = chaoskit("run", str(exp), "--out", str(tmp / name), "--plain", *opts, state=state)
    out, err = proc.communicate(timeout=90)
    return proc.returncode, json.loads((tmp / name / "summary.json").read_text()), out + err


def _query(prometheus: str, **params: object) -> list[dict]:
    path = "query_range" if "step" in params else "query"
    data = json.loads(_get(f"{prometheus}/api/v1/{path}?{urllib.parse.urlencode(params)}"))
    assert data["status"] == "success", data
    return data["data"]["result"]


def fault_window(prometheus: str, experiment: str, start: float, end: float) -> tuple[float, float]:
    """First and last time chaoskit_fault_active was 1, from a PromQL range query (step 0.05s)."""
    result = _query(prometheus, query=f'chaoskit_fault_active{{experiment="{experiment}"}}', start=start, end=end,
                    step="0.05")
    assert len(result) == 1, result
    ones = [float(t) for t, v in result[0]["values"] if v == "1"]
    assert ones, result
    return min(ones), max(ones)


def scrapes(prometheus: str, experiment: str, at: float) -> tuple[list[float], list[tuple[float, str]]]:
    """The raw samples: when Prometheus scraped the run's port, and what chaoskit_fault_active was each time."""
    up = _query(prometheus, query='up{job="chaoskit"}[2m]', time=at)[0]["values"]
    active = _query(prometheus, query=f'chaoskit_fault_active{{experiment="{experiment}"}}[2m]', time=at)
    return [float(t) for t, _ in up], [(float(t), v) for t, v in active[0]["values"]]


def test_an_alert_on_the_fault_fires_the_probe_holds_and_prometheus_has_the_fault_window(
        stack, sleeper, tmp_path, state_dir):
    name = "alert-holds"
    probes = (alert_probe("prom-alerts", stack.prometheus, "ChaosFault", name)
              + alert_probe("am-alerts", stack.alertmanager, "ChaosFault", name, source="alertmanager"))
    code, s, out = run(tmp_path, name, experiment(name, sleeper.pid, probes), state_dir,
                       "--metrics-port", str(stack.metrics_port), "--pushgateway", stack.pushgateway)
    assert code == 0, out
    fault = s["faults"][0]
    det = {a["probe"]: a for a in s["detection"]["alerts"]}
    for probe in ("prom-alerts", "am-alerts"):
        a = det[probe]
        assert a["detected"] == "detected" and a["resolved"] == "resolved", a
        assert 0 < a["detect_s"] <= 8 and 0 < a["resolve_s"] <= 10, a
    print(f"\nTTD prometheus {det['prom-alerts']['detect_s']}s alertmanager {det['am-alerts']['detect_s']}s; "
          f"TTR {det['prom-alerts']['resolve_s']}s / {det['am-alerts']['resolve_s']}s; "
          f"MTTD {s['detection']['mttd_s']}s MTTR {s['detection']['mttr_s']}s")
    assert s["detection"]["noisy"] == []
    applied, reverted = fault["applied_at"], fault["reverted_at"]
    first, last = fault_window(stack.prometheus, name, s["started"] - 5, s["ended"] + 5)
    print(f"fault window in Prometheus (range query, step 0.05s) vs journal: start {first - applied:+.3f}s, "
          f"end {last - reverted:+.3f}s (scrape interval 1s)")
    assert -0.05 <= first - applied <= 1.0 + 0.05 + 0.2 and -0.05 <= last - reverted <= 1.0 + 0.05 + 0.2
    ups, active = scrapes(stack.prometheus, name, s["ended"] + 3)  # exactly: the scrapes within the fault saw it
    ones = [t for t, v in active if v == "1"]
    race = 0.05  # a scrape stamped just before the apply (or revert) may read the gauge just after it
    assert ones and all(applied - race <= t <= reverted + race for t in ones), (ones, ups)
    assert not [t for t in ups if applied + race < t < reverted - race and t not in ones], (ones, ups)
    pushed = _get(f"{stack.pushgateway}/metrics").decode()
    held = [line for line in pushed.splitlines() if line.startswith("chaoskit_run_verdict{")
            and f'run_id="{s["run_id"]}"' in line and 'verdict="held"' in line]
    assert len(held) == 1 and held[0].endswith(" 1") and 'job="chaoskit"' in held[0], pushed[-2000:]
    assert f'experiment="{name}"' in held[0]
    md = (tmp_path / name / "report.html").read_text()
    assert "MTTD" in md and "ChaosFault (prom-alerts): detected in" in md
    if keep := os.environ.get("CHAOSKIT_KEEP_REPORT"):  # the docs' picture: scripts/screenshots.py --report
        shutil.copytree(tmp_path / name, keep, dirs_exist_ok=True)


def test_a_rule_that_cannot_fire_deviates(stack, sleeper, tmp_path, state_dir):
    name = "alert-never"
    probes = alert_probe("alerts", stack.prometheus, "NeverFires", name, detect="2s")
    code, s, out = run(tmp_path, name, experiment(name, sleeper.pid, probes, fault_s=3, after_s=2), state_dir,
                       "--metrics-port", str(stack.metrics_port))
    assert code == 1, out
    assert s["verdict"] == "deviated"
    assert any("NeverFires: not firing fault #1 freeze's apply (detect_within 2s)" in d for d in s["deviations"]), \
        s["deviations"]
    assert [a["detected"] for a in s["detection"]["alerts"]] == ["missed"]


def test_detect_within_shorter_than_the_rule_for_deviates_while_it_is_pending(stack, sleeper, tmp_path, state_dir):
    name = "alert-slow"
    probes = alert_probe("alerts", stack.prometheus, "SlowToFire", name, detect="1s")
    code, s, out = run(tmp_path, name, experiment(name, sleeper.pid, probes, fault_s=3, after_s=2), state_dir,
                       "--metrics-port", str(stack.metrics_port))
    assert code == 1, out
    assert any("SlowToFire: not firing" in d and "(detect_within 1s)" in d for d in s["deviations"]), s["deviations"]
    during = [x["values"]["state.SlowToFire"] for x in s["samples"] if x["phase"] == "during"]
    assert "pending" in during and "firing" not in during, during  # the rule ran; its `for: 10s` held it back


def test_exporters_pointed_at_closed_ports_change_neither_verdict_nor_exit_code(sleeper, tmp_path, state_dir):
    closed = free_port()
    held = socket.socket()
    held.bind(("127.0.0.1", 0))  # a --metrics-port that cannot be bound
    held.listen()
    try:
        probes = alert_probe("alerts", f"http://127.0.0.1:{closed}", "ChaosFault", "closed")
        text = experiment("closed", sleeper.pid, probes, fault_s=1, after_s=2)
        t0 = time.monotonic()
        base = run(tmp_path, "plain", text, state_dir)
        base_took, t0 = time.monotonic() - t0, time.monotonic()
        code, s, out = run(tmp_path, "exporters", text, state_dir, "--metrics-port", str(held.getsockname()[1]),
                           "--pushgateway", f"http://127.0.0.1:{closed}",
                           "--otlp-endpoint", f"http://127.0.0.1:{closed}")
        took = time.monotonic() - t0
    finally:
        held.close()
    assert (code, s["verdict"]) == (base[0], base[1]["verdict"]) == (0, "held"), out
    print(f"\nclosed ports: run {s['duration_s']:.2f}s (without exporters {base[1]['duration_s']:.2f}s), process "
          f"{took:.2f}s ({base_took:.2f}s)")
    assert s["duration_s"] < base[1]["duration_s"] + 1.0  # the run itself (start to verdict) is not held up
    assert took < base_took + 6  # after it: the push and the OTLP flush give up within their 3 s timeout (+1 s, + load)
    warned = [json.loads(line) for line in (tmp_path / "exporters" / "journal.jsonl").read_text().splitlines()
              if '"event":"error"' in line]
    assert sorted(w["where"] for w in warned) == ["metrics", "otlp", "pushgateway"], warned
    assert all(w["error"].startswith("warning: ") for w in warned)
    assert "probe alerts: resolve_within 10s is longer than steadyState.after.within 2s" in out
    events = [json.loads(line)["event"] for line in (tmp_path / "exporters" / "journal.jsonl").read_text().splitlines()]
    assert events[:3] == ["experiment", "host", "run"] and events[3] == "error"  # the bind warning: once it started
    assert all(x["values"]["source_up"] == 0 for x in s["samples"] if x["probe"] == "alerts")


def test_a_suite_serves_each_experiment_on_the_port_in_turn_and_pushes_each_run(stack, sleeper, tmp_path, state_dir):
    text = experiment("{name}", sleeper.pid, "    - {name: up, type: command, argv: [\"true\"]}\n", fault_s=0.5,
                      after_s=1)
    files = [write(tmp_path / f"{i}-s.yaml", text.replace("{name}", f"suite-{i}")) for i in (1, 2)]
    proc = chaoskit("run", *map(str, files), "--out", str(tmp_path / "suite"), "--plain", "--metrics-port",
                    str(stack.metrics_port), "--pushgateway", stack.pushgateway, state=state_dir)
    out, err = proc.communicate(timeout=90)
    assert proc.returncode == 0, out + err
    assert err.count(f"metrics: http://127.0.0.1:{stack.metrics_port}/metrics") == 2 and "warning" not in err, err
    pushed = _get(f"{stack.pushgateway}/metrics").decode()
    for i in (1, 2):
        run_id = json.loads(next((tmp_path / "suite").glob(f"0{i}-*/summary.json")).read_text())["run_id"]
        assert f'chaoskit_run_verdict{{experiment="suite-{i}",instance="",job="chaoskit",run_id="{run_id}",' \
               f'verdict="held"}} 1' in pushed
