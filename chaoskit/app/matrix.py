"""`chaoskit matrix FILE`: every cell of a gateways x faults matrix run in order as its own experiment (its own
deployment, ledgered with its own watchdog), measured, and written out after each cell so that a killed matrix
resumes where it stopped (--resume): matrix.json, matrix.md, matrix.html."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from chaoskit import __version__
from chaoskit.app.matrix_measures import UNSTEADY, measure
from chaoskit.app.matrix_report import write_reports
from chaoskit.errors import SpecError
from chaoskit.experiment.loader import load_experiment
from chaoskit.experiment.matrix import Cell, MatrixSpec, cells, experiment, load_matrix
from chaoskit.reference import gateways

CELL_TIMEOUT_S = 600.0  # one cell's `chaoskit run`, deployment start and stop included


@dataclass(frozen=True)
class MatrixOutcome:
    out: Path
    results: list[dict[str, Any]]

    @property
    def incomplete(self) -> list[str]:
        """Cells whose run gave no verdict (held or deviated): an error, a timeout, an interruption, a steady
        state that did not hold before the fault in both of the cell's runs."""
        return [r["cell"] for r in self.results if r["measures"]["verdict"] not in ("held", "deviated")]


def prepare(path: Path, out: Path, resume: bool, only: Sequence[str] = ()) -> tuple[MatrixSpec, list[Cell]]:
    """The matrix and its cells (of the faults named in `only`, when given), every cell's experiment written and
    validated before any runs (a wrong one: SpecError, nothing started); an existing --out without --resume is
    refused."""
    spec = load_matrix(path)
    if only:
        if unknown := sorted(set(only) - {f.name for f in spec.faults}):
            raise SpecError(f"{path}: --fault {', '.join(unknown)}: no such fault (the matrix has "
                            f"{', '.join(f.name for f in spec.faults)})")
        spec = spec.model_copy(update={"faults": [f for f in spec.faults if f.name in only]})
    if (out / "matrix.json").exists() and not resume:
        raise SpecError(f"{out} holds a matrix already: --resume to finish it, or another --out")
    todo = cells(spec)
    for cell in todo:
        file = cell_dir(out, cell) / "experiment.yaml"
        file.parent.mkdir(parents=True, exist_ok=True)
        file.write_text(yaml.safe_dump(experiment(spec, cell), sort_keys=False))
        try:
            load_experiment(file, strict=False)
        except SpecError as e:
            raise SpecError(f"{path}: cell {cell.id}: {e}") from None
    return spec, todo


def run_matrix(path: Path, out: Path, resume: bool, say: Callable[[str], None],
               only: Sequence[str] = ()) -> MatrixOutcome:
    spec, todo = prepare(path, out, resume, only)
    results: list[dict[str, Any]] = []
    for k, cell in enumerate(todo, 1):
        saved = cell_dir(out, cell) / "result.json"
        if resume and saved.exists():
            results.append(json.loads(saved.read_text()))
            say(f"[{k}/{len(todo)}] {cell.id}: done before ({results[-1]['measures']['verdict']})")
            continue
        say(f"[{k}/{len(todo)}] {cell.id}: running")
        results.append(run_cell(spec, cell, out))
        if results[-1]["measures"]["verdict"] == UNSTEADY:  # a deployment that was not ready says nothing of the fault
            aside = set_aside(out, cell)
            say(f"[{k}/{len(todo)}] {cell.id}: the steady state did not hold before the fault (nothing injected; "
                f"kept in {aside}): running it once more")
            results[-1] = {**run_cell(spec, cell, out), "unsteady_before": int(aside.name.removeprefix("unsteady-"))}
        saved.write_text(json.dumps(results[-1], indent=2))
        m = results[-1]["measures"]
        say(f"[{k}/{len(todo)}] {cell.id}: {m['verdict']} (error rate {m['error_rate']}, eject "
            f"{m['time_to_eject_s']} s, amplification {m['amplification']})")
        write_reports(out, summary(spec, results))
    write_reports(out, summary(spec, results))
    return MatrixOutcome(out, results)


def run_cell(spec: MatrixSpec, cell: Cell, out: Path) -> dict[str, Any]:
    d = cell_dir(out, cell)
    argv = [sys.executable, "-m", "chaoskit", "run", str(d / "experiment.yaml"), "--out", str(d / "run")]
    env = {**os.environ, "CHAOSKIT_REF_DIR": str(d / "ref"), "NO_COLOR": "1"}
    started = time.time()
    with open(d / "run.log", "w") as log:
        try:
            rc = subprocess.run(argv, stdout=log, stderr=subprocess.STDOUT, env=env, stdin=subprocess.DEVNULL,
                                timeout=CELL_TIMEOUT_S).returncode
        except subprocess.TimeoutExpired:
            rc = 124
    taps = sorted(d.glob("ref-*/logs/tap.requests.jsonl"))
    m = measure(d / "run" / "journal.jsonl", taps[-1] if taps else None, f"{spec.engine}-0", spec.load.rate)
    return {"cell": cell.id, "gateway": cell.gateway, "fault": cell.fault.name, "exit_code": rc,
            "started": started, "seconds": round(time.time() - started, 1), "measures": m.to_json()}


def cell_dir(out: Path, cell: Cell) -> Path:
    return out / "cells" / cell.id


def set_aside(out: Path, cell: Cell) -> Path:
    """Move a cell's run, deployment and log into a new folder unsteady-N of it (where its next run's do not go,
    N counting the cell's unsteady runs, --resume included); that folder."""
    d = cell_dir(out, cell)
    aside = d / f"unsteady-{len(list(d.glob('unsteady-*'))) + 1}"
    aside.mkdir()
    for p in [d / "run", d / "run.log", *d.glob("ref-*")]:
        if p.exists():
            p.rename(aside / p.name)
    return aside


def summary(spec: MatrixSpec, results: list[dict[str, Any]]) -> dict[str, Any]:
    versions = {g: (__version__ if g == gateways.CHAOSKIT else gateways.kind(g).version()) for g in spec.gateways}
    return {"matrix": spec.metadata.name, "description": spec.metadata.description, "chaoskit": __version__,
            "engine": spec.engine, "replicas": spec.replicas, "gateways": spec.gateways, "versions": versions,
            "faults": [{"name": f.name, "description": f.description} for f in spec.faults],
            "load": spec.load.model_dump(), "duration_s": spec.duration,
            "readmit_window_s": spec.readmit_window, "recovery_s": spec.recovery,
            "host": os.uname().nodename, "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            "cells": results}
