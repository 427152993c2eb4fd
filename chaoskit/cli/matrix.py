"""`chaoskit matrix FILE`: gateways x faults, each cell an experiment of its own, measured and tabulated."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.markup import escape

from chaoskit.errors import ChaoskitError
from chaoskit.term import console

out = console()
err = console(stderr=True)


def matrix(
    file: Path = typer.Argument(..., help="a matrix file (kind: Matrix) or a bundled matrix's name (gateways)"),
    out_dir: Path = typer.Option(None, "--out", help="where the cells and matrix.json/md/html go (default "
                                                     "chaoskit-runs/matrix-NAME)"),
    resume: bool = typer.Option(False, "--resume", help="finish a matrix an interruption stopped: cells with a "
                                                       "result are kept, the others run"),
    faults: list[str] = typer.Option([], "--fault", help="run only this fault's column (repeat for more)"),
) -> None:
    """Run every gateway x fault cell of a matrix in order (each brings its deployment up and down), measure
    each (verdict, client error rate, p99, time to eject and readmit the faulty replica, retry amplification,
    stream outcomes, metastability) and write matrix.json, matrix.md and matrix.html. Exit 0 when every cell
    gave a verdict (held or deviated: the matrix measures, it does not gate), 1 when a cell gave none, 2 for a
    wrong matrix file (nothing run). A cell whose steady state did not hold before its fault (nothing injected:
    a deployment not ready yet measures nothing) runs once more; twice, and it has no verdict (`unsteady`)."""
    from chaoskit.app.matrix import run_matrix
    from chaoskit.paths import library

    path = file
    if not file.exists() and not file.is_absolute():
        for candidate in (library("matrices") / file, library("matrices") / f"{file}.yaml"):
            if candidate.exists():
                path = candidate
    try:
        if not path.exists():
            raise ChaoskitError(f"{file}: no such matrix file, and no bundled matrix of that name")
        target = out_dir or Path("chaoskit-runs") / f"matrix-{path.stem}"
        outcome = run_matrix(path, target, resume, say=lambda m: err.print(m, highlight=False, markup=False),
                             only=faults)
    except ChaoskitError as e:
        for line in str(e).splitlines():
            err.print(f"[red]error:[/] {escape(line)}", highlight=False, soft_wrap=True)
        raise typer.Exit(e.exit_code) from None
    out.print(f"matrix: {len(outcome.results)} cells; {outcome.out / 'matrix.md'}, matrix.json, matrix.html",
              highlight=False, markup=False, soft_wrap=True)
    if outcome.incomplete:
        err.print(f"[red]no verdict:[/] {', '.join(outcome.incomplete)} (see each cell's run.log)", highlight=False)
        raise typer.Exit(1)
