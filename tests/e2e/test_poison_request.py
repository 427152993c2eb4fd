"""poison/poison-request-retry-storm: one request whose prompt kills its replica, and a gateway that retries on
the next replica; exactly its documented exit code without and with `--var fix=true`, the blast radius (replicas
the gateway still routes to) measured, and no replica process left behind."""

from __future__ import annotations

import json

import pytest

from tests.conftest import ROOT, chaoskit, requires_triton
from tests.helpers.survivors import survivors

SCENARIO = ROOT / "experiments" / "poison" / "poison-request-retry-storm.yaml"


@requires_triton
@pytest.mark.parametrize("fix, expected, lost", [("false", 1, 2), ("true", 0, 1)])
def test_poison_request_takes_every_replica_down_unless_death_is_not_retried(tmp_path, state_dir, fix, expected,
                                                                             lost):
    p = chaoskit("run", str(SCENARIO), "--var", f"fix={fix}", "--out", str(tmp_path / "o"), "--plain",
                 state=state_dir, env={"CHAOSKIT_REF_DIR": str(tmp_path / "ref")})
    out, err = p.communicate(timeout=120)
    assert p.returncode == expected, out + err
    s = json.loads((tmp_path / "o" / "summary.json").read_text())
    up = [x["values"]["value"] for x in s["samples"]
          if x["probe"] == "replicas-up" and x["values"].get("value") is not None]
    print(f"\nfix={fix}: replicas up {up}, recovered after {s.get('recovery_s')} s")
    assert up[0] == 2 and min(up) == 2 - lost and up[-1] == 2 - lost  # nothing restarts a dead replica
    assert survivors(tmp_path / "ref") == [], out + err  # the process list's (`down` empties the records)
