"""A fault family and a probe from a package of their own (tests/fixtures/plugin, built with its pyproject and
installed into a throwaway venv that sees this checkout's chaoskit): registered through the entry points, run by
`chaoskit run`, and reverted by the watchdog from the ledger when the run is SIGKILLed."""

from __future__ import annotations

import json
import shutil
import signal
import site
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import ROOT, ledger_ops, ledgers, wait_for

FIXTURE = ROOT / "tests" / "fixtures" / "plugin"
pytestmark = pytest.mark.timeout(600)  # the first test's setup: a venv (60 s) and a pip install (300 s) at most


@pytest.fixture(scope="module")
def plugin_python(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The python of a venv that has the plugin installed (a real wheel build of the fixture, no network) and
    sees this checkout's venv, chaoskit included, through a .pth; the venv is removed afterwards."""
    tmp = tmp_path_factory.mktemp("plugin")
    venv = tmp / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=60)
    python = venv / "bin" / "python"
    purelib = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             capture_output=True, text=True, check=True).stdout.strip()
    dev_site = site.getsitepackages()[0]
    (Path(purelib) / "chaoskit_dev.pth").write_text(f"import site; site.addsitedir({dev_site!r})\n")
    src = shutil.copytree(FIXTURE, tmp / "src")  # built outside the checkout: no build/ or egg-info left there
    subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "-q", "--no-deps",
                    "--no-build-isolation", "--no-index", str(src)], check=True, timeout=300)
    try:
        yield python
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def run_py(python: Path, code: str) -> str:
    """Its output, run outside the checkout (whose chaoskit.egg-info would otherwise come first on the path)."""
    return subprocess.run([str(python), "-c", code], cwd="/", capture_output=True, text=True, check=True,
                          timeout=60).stdout


REGISTRY = """
import json
from chaoskit.injectors import INJECTORS, injector_class
from chaoskit.probes import PROBES
from chaoskit.experiment.schema import experiment_schema
print(json.dumps({"injectors": [c.type for c in INJECTORS], "probes": [c.type for c in PROBES],
                  "where": injector_class("demo.marker").__module__ if "demo.marker" in [c.type for c in INJECTORS]
                  else None, "schema": "MarkerSpec" in experiment_schema()["$defs"]}))
"""


def test_the_plugin_registers_its_fault_probe_and_schema_only_where_it_is_installed(plugin_python):
    there = json.loads(run_py(plugin_python, REGISTRY))
    here = json.loads(run_py(Path(sys.executable), REGISTRY))
    assert there["injectors"] == [*here["injectors"], "demo.marker"]
    assert there["probes"] == [*here["probes"], "demo.marker"]
    assert (there["where"], there["schema"]) == ("chaoskit_demo.marker", True)
    assert (here["where"], here["schema"]) == (None, False)


EXPERIMENT = """\
apiVersion: chaoskit/v1
kind: Experiment
metadata: {{name: plugin-marker}}
steadyState:
  probes:
    - {{name: marker, type: demo.marker, path: "{path}", phases: [before, after], expect: {{exists: 0}}}}
  during: null
  after: {{within: 5s, every: 100ms}}
method:
  - inject: {{type: demo.marker, path: "{path}"}}
    duration: {duration}
"""


def chaoskit_run(python: Path, tmp: Path, duration: str) -> tuple[subprocess.Popen, Path, Path]:
    """`chaoskit run` of the plugin's fault in the plugin's venv; (the run, the marker file, the state dir)."""
    marker, state = tmp / "marker", tmp / "state"
    exp = tmp / "e.yaml"
    exp.write_text(EXPERIMENT.format(path=marker, duration=duration))
    run = subprocess.Popen([str(python), "-m", "chaoskit", "run", str(exp), "--out", str(tmp / "out"), "--plain"],
                           env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "CHAOSKIT_STATE_DIR": str(state)},
                           cwd=tmp, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    return run, marker, state


def test_chaoskit_run_applies_observes_and_reverts_the_plugin_fault(plugin_python, tmp_path):
    run, marker, state = chaoskit_run(plugin_python, tmp_path, "300ms")
    out, err = run.communicate(timeout=120)
    assert run.returncode == 0, err[-2000:]
    events = [json.loads(line) for line in (tmp_path / "out" / "journal.jsonl").read_text().splitlines()]
    applied = [e for e in events if e["event"] == "fault_applied"]
    observed = [e for e in events if e["event"] == "fault_observed" and e["when"] == "applied"]
    assert [e["type"] for e in applied] == ["demo.marker"]
    assert [e["details"]["in_effect"] for e in observed] == [True]
    assert [e["id"] for e in events if e["event"] == "fault_reverted"] == [applied[0]["id"]]
    assert not marker.exists() and ledgers(state) == []  # closed and discarded: nothing left to revert


def test_the_watchdog_reverts_the_plugin_fault_after_a_sigkill_of_the_run(plugin_python, tmp_path):
    run, marker, state = chaoskit_run(plugin_python, tmp_path, "60s")
    try:
        wait_for(lambda: marker.exists() or run.poll() is not None, timeout=60)
        assert run.poll() is None and marker.read_text() == "chaos"
        # the engine writes `applied` to the ledger once the plugin's apply (which wrote the marker) has returned
        wait_for(lambda: "applied" in ledger_ops(ledgers(state)[0]) or run.poll() is not None, timeout=10)
        ops = ledger_ops(ledgers(state)[0])
        assert "applied" in ops and "reverted" not in ops
    finally:
        run.send_signal(signal.SIGKILL)
        run.communicate()
    took = wait_for(lambda: not marker.exists(), timeout=10)
    assert took < 5.0
    wait_for(lambda: ledger_ops(ledgers(state)[0])[-1] == "closed", timeout=5)
    assert "reverted" in ledger_ops(ledgers(state)[0])
