"""Bare numbers in time fields (issue 43, item 3): in a file a person wrote (an experiment, what it includes, a
CLI option) a duration needs its unit; `delay: 200` is exit 2 at validate naming file:line:col, the field and
both readings. Python code keeps passing seconds. A delay at least as long as its step, or as every client's
timeout through it, is a warning for every fault that delays."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from chaoskit.cli.main import app
from chaoskit.errors import SpecError
from chaoskit.experiment.loader import load_experiment
from chaoskit.experiment.models import Experiment
from chaoskit.injectors.netem.fault import NetemSpec
from chaoskit.units import bare_duration, parse_duration

HEAD = """\
apiVersion: chaoskit/v1
kind: Experiment
metadata: {name: timed}
"""
PROBE = """\
steadyState:
  probes:
    - name: up
      type: http
      url: http://127.0.0.1:9/
      timeout: PROBE_TIMEOUT
  during: {every: EVERY}
"""
NETEM = """\
method:
  - name: slow
    inject:
      type: network.netem
      target: {interface: lo}
      delay: DELAY
      jitter: JITTER
    duration: DURATION
"""
DEFAULTS = {"PROBE_TIMEOUT": "2s", "EVERY": "1s", "DELAY": "200ms", "JITTER": "0", "DURATION": "10s"}


def write(tmp_path: Path, text: str = HEAD + PROBE + NETEM, **values: str) -> Path:
    for key, default in DEFAULTS.items():
        text = text.replace(key, values.get(key, default))
    f = tmp_path / "exp.yaml"
    f.write_text(text)
    return f


def errors(path: Path, **kw) -> str:
    with pytest.raises(SpecError) as e:
        load_experiment(path, strict=False, **kw)
    return str(e.value)


@pytest.mark.parametrize("key, line, col, field", [
    ("DELAY", 16, 7, "method[0].inject.delay"),
    ("JITTER", 17, 7, "method[0].inject.jitter"),
    ("DURATION", 18, 5, "method[0].duration"),
    ("PROBE_TIMEOUT", 9, 7, "steadyState.probes[0].timeout"),
    ("EVERY", 10, 12, "steadyState.during.every"),
])
@pytest.mark.parametrize("number", ["200", "1.5", '"200"'])
def test_a_bare_number_in_a_time_field_names_its_place_and_both_readings(tmp_path, key, line, col, field, number):
    values = {key: number, "DELAY": "300s"} if key == "JITTER" else {key: number}
    f = write(tmp_path, **values)
    text = number.strip('"')
    assert errors(f) == f"{f}:{line}:{col}: {field}: a bare number is ambiguous: write {text}ms or {text}s"


def test_validate_refuses_delay_200_with_exit_2(tmp_path):
    f = write(tmp_path, DELAY="200")
    result = CliRunner().invoke(app, ["validate", str(f)])
    assert result.exit_code == 2, result.output
    assert f"{f}:16:7: method[0].inject.delay: a bare number is ambiguous: write 200ms or 200s" in result.output
    assert "✓" not in result.output


def test_zero_and_numbers_with_units_are_fine(tmp_path):
    exp = load_experiment(write(tmp_path, DELAY="0.2s", JITTER="0", EVERY="500ms"), strict=False).experiment
    assert exp.method[0].inject.delay == 0.2 and exp.method[0].inject.jitter == 0.0
    assert exp.steady_state.during.every == 0.5
    exp = load_experiment(write(tmp_path, DELAY="250us", JITTER="0.0"), strict=False).experiment
    assert exp.method[0].inject.delay == pytest.approx(250e-6)


def test_a_variable_that_fills_a_time_field_needs_its_unit_too(tmp_path):
    text = (HEAD + "vars: {d: 200}\n" + PROBE + NETEM).replace("DELAY", '"{d}"')
    f = write(tmp_path, text)
    assert errors(f).endswith("method[0].inject.delay: a bare number is ambiguous: write 200ms or 200s "
                              "(the value came from '{d}')")
    assert "write 5ms or 5s (the value came from '{d}')" in errors(f, cli_vars={"d": "5"})
    assert load_experiment(f, cli_vars={"d": "5ms"}, strict=False).experiment.method[0].inject.delay == 0.005


def test_a_bare_number_in_an_included_file_names_that_file(tmp_path):
    (tmp_path / "faults").mkdir()
    lib = tmp_path / "faults" / "slow-lo.yaml"
    lib.write_text("inject:\n  type: network.netem\n  target: {interface: lo}\n  delay: 200\nduration: 10s\n")
    f = write(tmp_path, HEAD + PROBE + "method:\n  - include: slow-lo\n")
    assert errors(f) == f"{lib}:4:3: method[0].inject.delay: a bare number is ambiguous: write 200ms or 200s"
    # a key given beside `include:` is placed in the experiment file
    f.write_text(HEAD + PROBE.replace("PROBE_TIMEOUT", "2s").replace("EVERY", "1s")
                 + "method:\n  - include: slow-lo\n    duration: 7\n")
    assert f"{f}:13:5: method[0].duration: a bare number is ambiguous: write 7ms or 7s" in errors(f)


def test_every_duration_of_a_slo_probe_load_is_checked(tmp_path):
    text = HEAD + """\
steadyState:
  probes:
    - name: sla
      type: slo
      load: {url: "http://127.0.0.1:9/", rate: 5, duration: 2, timeout: 10s, slo: {ttft: 200}}
method:
  - pause: 1s
"""
    problems = errors(write(tmp_path, text)).splitlines()
    assert [p.split(": ", 1)[1] for p in problems] == [
        "steadyState.probes[0].load.duration: a bare number is ambiguous: write 2ms or 2s",
        "steadyState.probes[0].load.slo.ttft: a bare number is ambiguous: write 200ms or 200s"]


def test_python_callers_still_pass_seconds():
    assert NetemSpec(type="network.netem", target={"interface": "lo"}, delay=0.2).delay == 0.2
    exp = Experiment.model_validate({
        "apiVersion": "chaoskit/v1", "kind": "Experiment", "metadata": {"name": "x"},
        "steadyState": {"probes": [{"name": "t", "type": "command", "argv": ["true"], "timeout": 3}]},
        "method": [{"pause": 1.5}]})
    assert exp.method[0].pause == 1.5 and exp.steady_state.probes[0].timeout == 3.0
    assert parse_duration(200) == 200.0 and parse_duration("7") == 7.0


@pytest.mark.parametrize("value, want", [(200, "200"), (1.5, "1.5"), ("200", "200"), (" 2 ", "2"), (0, None),
                                         ("0", None), (0.0, None), ("200ms", None), ("2s", None), (True, None)])
def test_bare_duration(value, want):
    assert bare_duration(value) == want


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_a_duration_is_finite(bad):
    with pytest.raises(ValueError):
        parse_duration(bad)


def test_chaoskit_load_options_need_their_unit():
    result = CliRunner().invoke(app, ["load", "http://127.0.0.1:9/", "--rate", "1", "--duration", "10",
                                      "--timeout", "2", "--slo", "ttft:200"])
    assert result.exit_code == 2, result.output
    for line in ("--duration: a bare number is ambiguous: write 10ms or 10s",
                 "--timeout: a bare number is ambiguous: write 2ms or 2s",
                 "ttft: a bare number is ambiguous: write 200ms or 200s"):
        assert line in result.output


def test_ref_up_latency_threshold_needs_its_unit(tmp_path):
    """Refused before anything starts (the directory is not even made)."""
    result = CliRunner().invoke(app, ["ref", "up", "--latency-threshold", "300", "--dir", str(tmp_path / "ref")])
    assert result.exit_code == 2, result.output
    assert "--latency-threshold 300: a bare number is ambiguous: write 300ms or 300s" in result.output
    assert not (tmp_path / "ref").exists()


def warnings(tmp_path: Path, text: str = HEAD + PROBE + NETEM, **values: str) -> list[str]:
    return load_experiment(write(tmp_path, text, **values), strict=False).warnings


def test_a_netem_delay_as_long_as_its_step_is_a_warning(tmp_path):
    (w,) = warnings(tmp_path, DELAY="10s", PROBE_TIMEOUT="30s")
    assert w.startswith(f"{tmp_path / 'exp.yaml'}:16:7: delay 10s is at least the step's duration (10s)")
    assert warnings(tmp_path, DELAY="9s", PROBE_TIMEOUT="30s") == []
    # delay and jitter: the longest hold
    assert len(warnings(tmp_path, DELAY="8s", JITTER="2s", PROBE_TIMEOUT="30s")) == 1


def test_a_netem_delay_every_client_gives_up_on_is_a_warning(tmp_path):
    (w,) = warnings(tmp_path, DELAY="2s", PROBE_TIMEOUT="2s")
    assert "delay 2s is at least the request timeout of every probe that may send through it ('up' (2s))" in w
    assert warnings(tmp_path, DELAY="1.9s", PROBE_TIMEOUT="2s") == []
    # one client that waits it out: no warning
    text = HEAD + PROBE.replace("  during:", """\
    - name: sla
      type: slo
      load: {url: "http://127.0.0.1:9/", rate: 1, duration: 1s, timeout: 30s}
  during:""") + NETEM
    assert warnings(tmp_path, text, DELAY="2s") == []


def test_a_fallback_that_delays_is_checked_too(tmp_path):
    text = HEAD + PROBE + """\
method:
  - inject: {type: process.signal, name: nothing-by-this-name, signal: SIGSTOP}
    fallback:
      - {type: network.netem, target: {interface: lo}, delay: 20s}
    duration: 5s
"""
    assert [w.split(": ", 1)[1] for w in warnings(tmp_path, text)] == [
        "delay 20s is at least the step's duration (5s): no request it holds is answered while the fault is in "
        "effect",
        "delay 20s is at least the request timeout of every probe that may send through it ('up' (2s)): they give "
        "up first, so they see timeouts, never slow answers"]


def test_a_proxy_latency_still_warns_only_for_its_own_clients(tmp_path):
    text = HEAD + PROBE + """\
method:
  - inject:
      type: network.proxy
      listen: 127.0.0.1:18080
      upstream: 127.0.0.1:9
      toxics: [{type: latency, latency: 3s}]
    duration: 10s
"""
    assert warnings(tmp_path, text) == []  # the probe goes to port 9 directly
    through = text.replace("url: http://127.0.0.1:9/", "url: http://127.0.0.1:18080/")
    (w,) = warnings(tmp_path, through)
    assert "latency 3s is at least the request timeout of every probe sending through it ('up' (2s))" in w


def test_the_dry_run_shows_the_warning(tmp_path):
    f = write(tmp_path, DELAY="200s")
    env = {**os.environ, "CHAOSKIT_STATE_DIR": str(tmp_path / "state")}
    p = subprocess.run([sys.executable, "-m", "chaoskit", "run", "--dry-run", "--plain", str(f)], env=env,
                       cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert "Traceback" not in p.stderr, p.stderr
    assert "delay 200s is at least the step's duration (10s)" in p.stderr


def test_each_probe_that_sends_requests_says_where_and_its_timeout():
    """The lint asks the probe spec (request_target), not a list of probe types: an http probe's requests go to
    its URL's own path; slo and correctness probes add their API's paths; the others send none."""
    from chaoskit.probes.alert import EXAMPLE as ALERT
    from chaoskit.probes.alert import AlertProbeSpec
    from chaoskit.probes.base import RequestTarget
    from chaoskit.probes.correctness import EXAMPLE as CORRECTNESS
    from chaoskit.probes.correctness import CorrectnessProbeSpec
    from chaoskit.probes.http import HttpProbeSpec
    from chaoskit.probes.slo import SloProbeSpec

    http = HttpProbeSpec(type="http", name="up", url="http://127.0.0.1:9/v1/x", timeout="2s")
    slo = SloProbeSpec.model_validate({"type": "slo", "name": "sla", "load": {
        "url": "http://127.0.0.1:9/", "rate": 1, "duration": "1s", "timeout": "30s"}})
    correctness = CorrectnessProbeSpec.model_validate({**CORRECTNESS, "request_timeout": "7s"})
    assert http.request_target() == RequestTarget("http://127.0.0.1:9/v1/x", 2.0, url_path=True)
    assert slo.request_target() == RequestTarget("http://127.0.0.1:9/", 30.0)
    assert correctness.request_target() == RequestTarget(CORRECTNESS["url"], 7.0)
    assert AlertProbeSpec.model_validate(ALERT).request_target() is None
