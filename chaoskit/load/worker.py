"""A sender process: `python -m chaoskit.load.worker` reads {"spec", "offsets", "start_epoch"} as JSON on stdin,
prints progress lines `P {...}` and finally `R {recorder}` on stdout."""

from __future__ import annotations

import json
import sys

from chaoskit.aio import run_fast
from chaoskit.load.generator import run
from chaoskit.load.recorder import Recorder
from chaoskit.load.spec import LoadSpec


def main() -> int:
    job = json.loads(sys.stdin.read())
    spec = LoadSpec.model_validate(job["spec"])
    rec = Recorder()

    def progress(r: Recorder, in_flight: int) -> None:
        print("P " + json.dumps({"sent": r.sent, "ok": r.ok, "errors": sum(r.errors.values()), "late": r.late,
                                 "in_flight": in_flight}), flush=True)

    run_fast(run(spec, job["offsets"], job["start_epoch"], rec, progress))
    print("R " + json.dumps(rec.to_json()), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
