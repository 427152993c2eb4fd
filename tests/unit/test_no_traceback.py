"""Bad input never ends in a traceback (issue 43, item 6): a proxy URL with a malformed placeholder where the
port goes made `chaoskit validate` end in urllib's `ValueError: Port could not be cast to integer value` from
the hold-warning lint. Every pass that reads a file (loader, lint, plan, dry run) says what is wrong, naming
file:line, or warns."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from chaoskit.cli.main import app
from chaoskit.errors import SpecError
from chaoskit.experiment import loader
from chaoskit.experiment.lint import _addr
from chaoskit.experiment.loader import LINT_FAILED, load_experiment
from chaoskit.model.types import check_url

ROOT = Path(__file__).resolve().parent.parent.parent
PROXY_LATENCY = ROOT / "experiments/network/proxy-latency.yaml"


@pytest.fixture
def env(tmp_path, monkeypatch) -> dict[str, str]:
    """No reference deployment running, whatever this host has: its facts are known at run time only."""
    values = {"CHAOSKIT_STATE_DIR": str(tmp_path / "state"), "CHAOSKIT_REF_DIR": str(tmp_path / "ref")}
    for k, v in values.items():
        monkeypatch.setenv(k, v)
    return {**os.environ, **values}


@pytest.fixture
def malformed(tmp_path) -> Path:
    text = PROXY_LATENCY.read_text()
    bad = text.replace('url: "http://127.0.0.1:{var.proxy_port}/v2', 'url: "http://127.0.0.1:{!ar.proxy_port}/v2')
    assert bad != text
    f = tmp_path / "malformed-port.yaml"
    f.write_text(bad)
    return f


def line_of(f: Path, text: str) -> int:
    return next(i for i, line in enumerate(f.read_text().splitlines(), 1) if text in line)


def test_validate_refuses_a_malformed_port_placeholder_with_exit_2_and_no_traceback(malformed, env):
    p = subprocess.run([sys.executable, "-m", "chaoskit", "validate", str(malformed)], env=env, capture_output=True,
                       text=True, timeout=120)
    out = p.stdout + p.stderr
    assert p.returncode == 2, out
    assert "Traceback" not in out and "ValueError" not in out
    line = line_of(malformed, "{!ar.proxy_port}")
    assert f"{malformed}:{line}:7: steadyState.probes[0].url: " in out
    assert "the port '{!ar.proxy_port}' is not a number" in out


def test_the_dry_run_refuses_it_too(malformed, env, tmp_path):
    p = subprocess.run([sys.executable, "-m", "chaoskit", "run", "--dry-run", "--plain", str(malformed)], env=env,
                       cwd=tmp_path, capture_output=True, text=True, timeout=120)
    out = p.stdout + p.stderr
    assert p.returncode == 2, out
    assert "Traceback" not in out and "the port '{!ar.proxy_port}' is not a number" in out


def test_a_port_known_only_at_run_time_is_no_error_and_no_crash(tmp_path, env):
    """`{target.gateway_port}` of a deployment not running yet stays in the URL until the run: the URL checks
    and the lint let it be."""
    text = PROXY_LATENCY.read_text().replace("{var.proxy_port}/v2", "{target.gateway_port}/v2")
    f = tmp_path / "deferred.yaml"
    f.write_text(text)
    result = CliRunner().invoke(app, ["validate", str(f)])
    assert result.exit_code == 0, result.output
    assert isinstance(result.exception, SystemExit | None) and LINT_FAILED not in result.output
    assert "{target.gateway_port} is resolved at run time" in result.output


@pytest.mark.parametrize("url", ["http://127.0.0.1:{!ar.proxy_port}/v2", "http://h:8o/", "http://u:p@h:1a/x",
                                 "http://[::1]:x/", "http://h:99999/", "http://[::1/"])
def test_a_url_whose_port_cannot_be_read_is_refused(url):
    with pytest.raises(ValueError):
        check_url(url)


@pytest.mark.parametrize("url", ["http://h/", "https://h:8443/x?y", "http://[::1]:80/", "http://{target.url}",
                                 "http://127.0.0.1:{target.gateway_port}/v2", "http://u:p@h:1/"])
def test_a_readable_url_passes(url):
    assert check_url(url) == url


def test_each_url_field_is_checked(tmp_path, env):
    f = tmp_path / "urls.yaml"
    f.write_text("""\
apiVersion: chaoskit/v1
kind: Experiment
metadata: {name: urls}
steadyState:
  probes:
    - {name: a, type: http, url: "http://h:x/"}
    - name: b
      type: slo
      load: {url: "http://h:y/", rate: 1, duration: 1s}
    - {name: c, type: correctness, url: "http://h:z", api: triton, prompts: [hi], record_url: "http://h:w"}
method:
  - pause: 1s
""")
    with pytest.raises(SpecError) as e:
        load_experiment(f, strict=False)
    fields = [line.split(": ")[1] for line in str(e.value).splitlines()]
    assert fields == ["steadyState.probes[0].url", "steadyState.probes[1].load.url", "steadyState.probes[2].url",
                      "steadyState.probes[2].record_url"]


def test_the_lint_reads_any_url_without_failing():
    assert _addr("http://127.0.0.1:{!ar.proxy_port}/v2") is None
    assert _addr("http://[::1") is None
    assert _addr("http://127.0.0.1:8000/x") == ("127.0.0.1", 8000)


def test_a_lint_that_fails_is_a_warning_naming_the_file_never_a_traceback(tmp_path, env, monkeypatch):
    def broken(*_a):
        raise ValueError("Port could not be cast to integer value as 'x'")

    monkeypatch.setattr(loader, "hold_warnings", broken)
    loaded = load_experiment(PROXY_LATENCY, strict=False)
    (w,) = loaded.warnings
    assert w.startswith(f"{PROXY_LATENCY}: {LINT_FAILED} (ValueError: Port could not be cast")
    result = CliRunner().invoke(app, ["validate", str(PROXY_LATENCY)])
    assert result.exit_code == 0 and isinstance(result.exception, SystemExit | None), result.output
    assert LINT_FAILED in result.output
