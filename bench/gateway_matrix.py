"""The bundled `gateways` matrix, whole: every gateway x fault cell, timed (issue: <= 30 minutes here).

Installs each of its gateways first (`chaoskit ref install gateway-NAME`: idempotent, not timed), then runs
`chaoskit matrix gateways --out DIR` (DIR: `--out`, default a temporary directory removed at the end) and reads
its matrix.json. docs/findings/gateways.md quotes such a run.

RESULT keys: matrix_s (the matrix command's wall time), cells, gateways, faults (of the matrix run), no_verdict
(cells that gave neither held nor deviated), held, deviated, metastable (cells whose goodput did not come back
within the recovery window), run_again (cells whose steady state did not hold before their fault: run once
more), goal_met, missed=.

Goals (GOALS below; exit 1 when one is missed): the whole matrix within 30 minutes, every cell a verdict, at least
5 gateways x 9 faults.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from chaoskit.experiment.matrix import load_matrix
from chaoskit.paths import library

sys.path.insert(0, str(Path(__file__).resolve().parent))
from goals import Goal, Goals  # noqa: E402

GOALS = Goals(Goal("matrix_s", "<=", 1800, "the whole bundled matrix"),
              Goal("no_verdict", "<=", 0, "cells that gave no verdict"),
              Goal("gateways", ">=", 5, "gateways in the matrix"), Goal("faults", ">=", 9, "faults in the matrix"))
MATRIX = "gateways"


def chaoskit(*args: str) -> list[str]:
    return [sys.executable, "-m", "chaoskit", *args]


def run(out: Path) -> int:
    spec = load_matrix(library("matrices") / f"{MATRIX}.yaml")
    for gateway in spec.gateways:
        subprocess.run(chaoskit("ref", "install", f"gateway-{gateway}"), check=True)
    start = time.monotonic()
    rc = subprocess.run(chaoskit("matrix", MATRIX, "--out", str(out))).returncode
    seconds = time.monotonic() - start
    summary = json.loads((out / "matrix.json").read_text())
    verdicts = [c["measures"]["verdict"] for c in summary["cells"]]
    print(f"chaoskit matrix {MATRIX}: exit {rc}, {len(verdicts)} cells in {seconds:.0f} s; {out / 'matrix.md'}")
    return GOALS.result({
        "matrix_s": round(seconds, 1), "cells": len(verdicts), "gateways": len(summary["gateways"]),
        "faults": len(summary["faults"]), "no_verdict": sum(v not in ("held", "deviated") for v in verdicts),
        "held": verdicts.count("held"), "deviated": verdicts.count("deviated"),
        "metastable": sum(bool(c["measures"]["metastable"]) for c in summary["cells"]),
        "run_again": sum(c.get("unsteady_before", 0) for c in summary["cells"])})


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, help="keep the matrix's cells and reports here (a new directory)")
    args = ap.parse_args()
    if args.out is not None:
        return run(args.out)
    tmp = Path(tempfile.mkdtemp(prefix="chaoskit-matrix-"))
    try:
        return run(tmp / MATRIX)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
