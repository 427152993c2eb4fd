"""Outputs that say the right number (issue 43, item 5): `validate` counts the method's steps and the faults and
pauses they hold, in words that fit the number; the report's events are listed in time order."""

from __future__ import annotations

from pathlib import Path

from typer.testing import CliRunner

from chaoskit.cli.main import app, method_size
from chaoskit.experiment.loader import load_experiment
from chaoskit.model.events import from_json
from chaoskit.report import html
from chaoskit.report.view import run_view

HEAD = """\
apiVersion: chaoskit/v1
kind: Experiment
metadata: {name: counted}
steadyState:
  probes: [{name: t, type: command, argv: ["true"]}]
method:
"""
FAULT = "{type: process.signal, name: 'nothing-by-this-name', signal: SIGSTOP}"


def _method(tmp_path: Path, method: str):
    f = tmp_path / "e.yaml"
    f.write_text(HEAD + method)
    return f, load_experiment(f, strict=False).experiment.method


def test_validate_counts_steps_and_the_faults_they_hold(tmp_path):
    one = f"  - inject: {FAULT}\n    duration: 1s\n"
    assert method_size(_method(tmp_path, one)[1]) == "1 step: 1 fault"
    parallel = "  - parallel:\n" + "".join(f"      - inject: {FAULT}\n        duration: 1s\n" for _ in range(3))
    assert method_size(_method(tmp_path, parallel)[1]) == "1 step: 3 faults"
    mixed = one + "  - pause: 1s\n" + parallel + one
    assert method_size(_method(tmp_path, mixed)[1]) == "4 steps: 5 faults, 1 pause"
    f, _ = _method(tmp_path, parallel)
    result = CliRunner().invoke(app, ["validate", str(f)])
    assert result.exit_code == 0, result.output
    assert "counted (1 step: 3 faults)" in result.output and "steps)" not in result.output


def test_the_reports_events_are_in_time_order():
    """A note journaled after a later one (an error noted by a revert thread, stamped when it happened) is still
    listed at its time."""
    lines = [{"t": 100.0, "event": "run", "run_id": "r", "experiment": "e"},
             {"t": 105.0, "event": "safeguard", "probe": "p", "reason": "later"},
             {"t": 103.0, "event": "error", "where": "revert", "error": "earlier"},
             {"t": 110.0, "event": "end", "verdict": "aborted", "exit_code": 3}]
    page = html.render(run_view([from_json(line) for line in lines]))
    events = page.split("<h2>Events</h2>", 1)[1]
    assert events.index("+3.00s") < events.index("+5.00s")
