"""`chaoskit run A.yaml dir/ ...` as a suite: experiments in order, each in its own run directory, one table,
one JUnit file with a testsuite per experiment, an index page linking each report, the worst exit code by the
documented order; --stop-on-failure; an interrupt stops the suite after a full rollback."""

from __future__ import annotations

import itertools
import json
import re
import signal
from pathlib import Path
from xml.etree import ElementTree as ET

import pytest

from chaoskit.report.outputs import EXIT_ORDER, phase_seconds, worst_exit
from tests.conftest import ROOT, chaoskit, proc_state

HELD = """\
apiVersion: chaoskit/v1
kind: Experiment
metadata: {name: a-held}
vars: {dur: 1s}
steadyState:
  probes:
    - {name: ok, type: command, argv: ["true"], expect: {exit_code: 0}}
  after: {within: 2s, every: 100ms}
method:
  - pause: "{dur}"
"""
INVALID = """\
apiVersion: chaoskit/v1
kind: Experiment
metadata: {name: b-invalid}
steadyState:
  probes:
    - {name: ok, type: command, argv: ["true"], expct: {exit_code: 0}}
method:
  - pause: 1s
"""
NOT_BEFORE = """\
apiVersion: chaoskit/v1
kind: Experiment
metadata: {name: c-not-before}
steadyState:
  probes:
    - {name: nope, type: command, argv: ["false"], expect: {duration_ms: "< 60000", exit_code: 0}}
method:
  - pause: 1s
"""
FREEZE = """\
apiVersion: chaoskit/v1
kind: Experiment
metadata: {{name: a-freeze}}
steadyState:
  probes:
    - {{name: ok, type: command, argv: ["true"], expect: {{exit_code: 0}}}}
  during: {{every: 200ms}}
method:
  - inject: {{type: process.signal, pid: {pid}}}
    duration: 30s
"""


@pytest.mark.parametrize("a,b", list(itertools.combinations(EXIT_ORDER, 2)))
def test_exit_code_order(a, b):
    """Earlier in EXIT_ORDER is worse: a suite with both exits with the earlier one, in any order."""
    assert worst_exit([a, b]) == worst_exit([b, a]) == a
    assert worst_exit([0, a, 0]) == a


def test_exit_code_order_is_documented():
    order = " > ".join(str(c) for c in EXIT_ORDER)
    assert order == "5 > 143 > 130 > 3 > 1 > 2 > 4 > 0"
    assert order in (ROOT / "docs" / "reference" / "exit-codes.md").read_text()  # generated; README links it
    ci = (ROOT / "docs" / "ci.md").read_text()  # links the generated page, does not copy its table
    assert "(reference/exit-codes.md)" in ci and "| 143" not in ci and order not in ci
    assert worst_exit([]) == 0 and worst_exit([0, 7, 1]) == 7  # an unknown code ranks just below 5


def _write(d: Path, name: str, text: str) -> Path:
    d.mkdir(parents=True, exist_ok=True)
    (d / name).write_text(text)
    return d / name


def test_suite_runs_in_order_with_one_summary(tmp_path, state_dir):
    _write(tmp_path / "dir", "a-held.yaml", HELD)
    _write(tmp_path / "dir", "b-invalid.yaml", INVALID)
    (tmp_path / "dir" / "notes.txt").write_text("not an experiment")
    c = _write(tmp_path, "c-not-before.yaml", NOT_BEFORE)
    out_dir = tmp_path / "suite"
    run = chaoskit("run", str(tmp_path / "dir"), str(c), "--var", "dur=300ms", "--out", str(out_dir), "--junit",
                   str(tmp_path / "junit.xml"), state=state_dir)
    out, err = run.communicate(timeout=90)
    assert run.returncode == 1, out + err  # deviated (1) outranks invalid (2) and held (0)
    assert out.index("suite 1/3:") < out.index("held (exit 0) a-held") < out.index("suite 2/3:") \
        < out.index("suite 3/3:") < out.index("deviated (exit 1) c-not-before")
    assert "unknown field 'expct'" in err  # the invalid file says why, as a single run would
    assert "suite exit 1 (the worst of the experiments' codes; order 5 > 143 > 130 > 3 > 1 > 2 > 4 > 0)" in out
    assert (out_dir / "01-a-held" / "report.html").is_file() and (out_dir / "03-c-not-before" / "summary.json").is_file()
    assert not (out_dir / "02-b-invalid").exists()
    # --var went only to the file that declares it
    held = json.loads((out_dir / "01-a-held" / "summary.json").read_text())
    assert held["verdict"] == "held"
    exp = next(json.loads(line) for line in (out_dir / "01-a-held" / "journal.jsonl").read_text().splitlines()
               if '"event":"experiment"' in line)
    assert exp["vars"] == {"dur": "300ms"}
    suites = ET.parse(tmp_path / "junit.xml").getroot()
    assert suites.tag == "testsuites" and suites.get("errors") == "1" and suites.get("failures") == "1"
    assert [s.get("name") for s in suites] == ["chaoskit.a-held", "chaoskit.b-invalid", "chaoskit.c-not-before"]
    assert suites[1].find("testcase/error").get("message").startswith("exit 2: ")
    index = (out_dir / "index.html").read_text()
    assert "href='01-a-held/report.html'" in index and "href='03-c-not-before/report.html'" in index
    md = (out_dir / "summary.md").read_text()
    assert md.startswith("### ❌ chaoskit suite (3/3 run): exit 1")
    assert "| b-invalid | ⛔ invalid | 2 |" in md and "### ✅ a-held: held (exit 0)" in md
    # paths relative to the summary (a CI job summary has no runner paths), the suite's own index too
    assert "Report: `01-a-held/report.html`" in md and "Reports: `index.html`" in md and "`/" not in md
    # a phase's testcase lasts the phase (the state history), not the sum of its samples' durations
    spans = phase_seconds([(s["state"], s["t"]) for s in held["states"]])
    times = {tc.get("name"): float(tc.get("time")) for tc in suites[0].iter("testcase")}
    assert spans["before"] > 0 and spans["after"] > 0
    assert times["before: ok"] == round(spans["before"], 3) and times["after: ok"] == round(spans["after"], 3)
    # the failing clause first, stamped with seconds since the start (not epoch seconds)
    failure = suites[2].find("testcase/failure")
    assert "did not hold: exit_code: " in failure.get("message")
    assert all(re.match(r"^\+\d+\.\d{3}s fail: exit_code: ", line) for line in failure.text.splitlines())


def test_stop_on_failure_and_unknown_vars(tmp_path, state_dir):
    bad = _write(tmp_path, "1-bad.yaml", INVALID)
    held = _write(tmp_path, "2-held.yaml", HELD)
    run = chaoskit("run", str(bad), str(held), "--stop-on-failure", "--out", str(tmp_path / "s"), "--junit",
                   str(tmp_path / "j.xml"), state=state_dir)
    out, err = run.communicate(timeout=60)
    assert run.returncode == 2, out + err
    assert "suite 2/2" not in out and "not run" in out and "--stop-on-failure" in out
    suites = ET.parse(tmp_path / "j.xml").getroot()
    assert suites.get("skipped") == "1" and suites[1].find("testcase/skipped") is not None
    assert not (tmp_path / "s" / "02-2-held").exists()
    run = chaoskit("run", str(bad), str(held), "--var", "nosuch=1", state=state_dir)
    _, err = run.communicate(timeout=60)
    assert run.returncode == 2 and "--var nosuch: no experiment of the suite declares or uses it" in err
    run = chaoskit("run", str(bad), str(held), "--journal", str(tmp_path / "j.jsonl"), state=state_dir)
    _, err = run.communicate(timeout=60)
    assert run.returncode == 2 and "a suite writes one per experiment" in err


def test_interrupt_stops_the_suite_after_rollback(tmp_path, state_dir, sleeper):
    first = _write(tmp_path, "1-freeze.yaml", FREEZE.format(pid=sleeper.pid))
    second = _write(tmp_path, "2-held.yaml", HELD)
    run = chaoskit("run", str(first), str(second), "--plain", "--out", str(tmp_path / "s"), state=state_dir)
    seen = []
    for line in run.stdout:
        seen.append(line)
        if "fault #1 process.signal applied" in line:
            break
    assert proc_state(sleeper.pid) == "T", "".join(seen)
    run.send_signal(signal.SIGINT)
    out, err = run.communicate(timeout=60)
    out = "".join(seen) + out
    assert run.returncode == 130, out + err
    assert proc_state(sleeper.pid) in ("S", "R")
    assert "suite 2/2" not in out and "interrupted" in out
    assert "| a-freeze | ⛔ interrupted | 130 |" in (tmp_path / "s" / "summary.md").read_text()


def test_ci_examples_are_valid_yaml_and_run_the_documented_commands():
    """README's CI gate is what the templates run (from the venv they install the wheel into), in its order, the
    rollback always; tests/e2e/test_ci_templates.py runs the templates' commands themselves."""
    import yaml

    readme = (ROOT / "README.md").read_text()
    block = readme.split("**A CI gate**", 1)[1].split("```sh\n", 1)[1].split("```", 1)[0]
    commands = [line.split("  #")[0].strip() for line in block.splitlines() if line.strip()]
    assert commands == ["chaoskit doctor", "chaoskit run chaos/ --ci --out chaoskit-runs/ci", "chaoskit rollback --all"]
    venv = [f".chaoskit-venv/bin/{c}" for c in commands]
    gh = yaml.safe_load((ROOT / "docs" / "ci" / "github-actions.yml").read_text())
    steps = gh["jobs"]["chaos"]["steps"]
    gh_runs = [s["run"] for s in steps if "run" in s]
    assert [c for c in gh_runs if c in venv] == venv  # each documented command, in order
    assert not [c for c in gh_runs if "make" in c.split()]
    assert (True in gh or "on" in gh) and gh["jobs"]["chaos"]["container"]["options"].startswith("--privileged")
    rollback = next(s for s in steps if s.get("run") == venv[-1])
    upload = next(s for s in steps if str(s.get("uses", "")).startswith("actions/upload-artifact"))
    assert rollback["if"] == upload["if"] == "always()" and upload["with"]["path"] == "chaoskit-runs/ci/"
    gl = yaml.safe_load((ROOT / "docs" / "ci" / "gitlab-ci.yml").read_text())["chaoskit"]
    gl_runs = [c.split("  #")[0].strip() for c in gl["before_script"] + gl["script"] + gl["after_script"]]
    assert [c for c in gl_runs if c in venv] == venv and not [c for c in gl_runs if "make" in c.split()]
    assert gl["after_script"][0].startswith(venv[-1])  # runs also when the script failed or was cancelled
    assert gl["artifacts"]["when"] == "always" and gl["artifacts"]["reports"]["junit"] == "chaoskit-runs/ci/junit.xml"


def test_a_second_run_into_the_same_out_dir_reports_only_itself(tmp_path, state_dir):
    """--out reused: the journal, summary and report are the second run's alone (not the first run's samples)."""
    failing = _write(tmp_path, "c.yaml", NOT_BEFORE)
    held = _write(tmp_path, "a.yaml", HELD)
    for args, code in (([str(failing)], 1), ([str(held), "--var", "dur=300ms"], 0)):
        p = chaoskit("run", *args, "--out", str(tmp_path / "o"), state=state_dir)
        out, err = p.communicate(timeout=60)
        assert p.returncode == code, out + err
    s = json.loads((tmp_path / "o" / "summary.json").read_text())
    assert s["verdict"] == "held" and {x["probe"] for x in s["samples"]} == {"ok"}
    assert all(x["verdict"] == "ok" for x in s["samples"])
