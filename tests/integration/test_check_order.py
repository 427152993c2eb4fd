"""The before and after checks sample their probes at once and journal each sample as it ends: a fast probe's
sample is not held back behind a slow one listed before it (the journal, and so the CI log, in time order)."""

from __future__ import annotations

import json

from tests.conftest import chaoskit, write

EXPERIMENT = """\
apiVersion: chaoskit/v1
kind: Experiment
metadata: {name: check-order}
steadyState:
  probes:
    - {name: slow, type: command, argv: ["sleep", "0.6"], phases: [before, after]}
    - {name: fast, type: command, argv: ["true"], phases: [before, after]}
method:
  - pause: 100ms
"""


def test_samples_are_journaled_as_they_end(tmp_path, state_dir):
    exp = write(tmp_path / "e.yaml", EXPERIMENT)
    p = chaoskit("run", str(exp), "--out", str(tmp_path / "o"), "--plain", state=state_dir)
    out, err = p.communicate(timeout=60)
    assert p.returncode == 0, out + err
    lines = [json.loads(x) for x in (tmp_path / "o" / "journal.jsonl").read_text().splitlines()]
    samples = [(e["phase"], e["probe"]) for e in lines if e["event"] == "sample"]
    assert samples == [("before", "fast"), ("before", "slow"), ("after", "fast"), ("after", "slow")], samples
    ends = [e["t"] + e["duration_ms"] / 1000 for e in lines if e["event"] == "sample"]
    assert ends == sorted(ends)
