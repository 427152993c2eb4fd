"""experiments/disk/throttle-model-repository.yaml as is, against a reference deployment whose model
repository lives on a loop device made by the test: reloads really wait on the throttled disk."""

from __future__ import annotations

import json
import os

from chaoskit.reference.deploy import Deployment, RefOptions
from tests.conftest import chaoskit, requires_triton

pytestmark = requires_triton


def test_throttled_model_repository_slows_model_load(mounted, tmp_path, state_dir):
    d = Deployment(mounted / "ref")
    d.up(RefOptions(port=18800, replicas=1), say=lambda _m: None)
    try:
        env_before = os.environ.get("CHAOSKIT_REF_DIR")
        os.environ["CHAOSKIT_REF_DIR"] = str(d.root)
        try:
            run = chaoskit("run", "experiments/disk/throttle-model-repository.yaml", "--var", "duration=8s",
                           "--out", str(tmp_path / "o"), state=state_dir)
            out, err = run.communicate(timeout=240)
        finally:
            os.environ.pop("CHAOSKIT_REF_DIR")
            if env_before is not None:
                os.environ["CHAOSKIT_REF_DIR"] = env_before
        s = json.loads((tmp_path / "o" / "summary.json").read_text())
        reloads = {ph: [x["values"]["stdout_number"] for x in s["samples"]
                        if x["probe"] == "model-reload-seconds" and x["phase"] == ph and x["values"]]
                   for ph in ("before", "during", "after")}
        print(f"\nmodel reload seconds: before {reloads['before']}, throttled {reloads['during']}, "
              f"after {reloads['after']}")
        assert run.returncode == 1, out + err  # the reload SLO (< 3 s) breaks while the disk is throttled
        assert s["rollback_complete"] and reloads["during"]
        assert max(reloads["during"]) > 2 * max(reloads["before"])
        assert s["recovery_s"] is not None
    finally:
        d.down(say=lambda _m: None)
