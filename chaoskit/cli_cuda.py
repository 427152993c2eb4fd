"""`chaoskit cuda-wrap`: start a program with the CUDA fault interposer loaded, so gpu.cuda_fault can reach it."""

from __future__ import annotations

import os
import secrets
import shlex
from pathlib import Path

import typer
from rich.markup import escape

from chaoskit import cbuild, paths
from chaoskit.gpu import cuda_fault_ctl as ctl
from chaoskit.term import console

err = console(stderr=True)


def _fail(message: str, code: int = 2) -> None:
    err.print(f"[red]error:[/] {escape(message)}", markup=True, highlight=False, soft_wrap=True)
    raise typer.Exit(code)


def _control_path(given: Path | None, command: list[str]) -> Path:
    if given is not None:
        return given
    name = Path(command[0]).name if command else "service"
    return paths.state_dir() / "cuda-fault" / f"{name}-{secrets.token_hex(4)}.ctl"


def cuda_wrap(
    command: list[str] = typer.Argument(None, help="the program and its arguments (after --)"),
    control: Path | None = typer.Option(None, "--control", metavar="FILE",
                                        help="the control file (default: a new one in chaoskit's state directory)"),
    print_env: bool = typer.Option(False, "--print-env",
                                   help="print the environment lines instead (systemd Environment=, docker -e)"),
) -> None:
    """Run COMMAND with chaoskit's CUDA fault interposer preloaded (it and its children; no effect until a
    gpu.cuda_fault is applied to it). Example: chaoskit cuda-wrap -- vllm serve MODEL"""
    if not command and not print_env:
        _fail("give the program to start after --, or --print-env")
    try:
        library = ctl.build()
    except cbuild.NoCompiler as e:
        _fail(f"{e}; the interposer is built once from C with the system compiler")
    except cbuild.CompileFailed as e:
        _fail(str(e), 1)
    path = _control_path(control, command or [])
    if not path.exists():
        try:
            ctl.create(path)
        except OSError as e:
            _fail(f"cannot create the control file {path}: {e.strerror}")
    env = ctl.environment(library, path, {k: v for k, v in os.environ.items() if k == "LD_PRELOAD"})
    if print_env:
        for key in ("LD_PRELOAD", ctl.ENV):
            print(f"{key}={shlex.quote(env[key])}")
        return
    try:
        os.execvpe(command[0], command, {**os.environ, **env})
    except OSError as e:
        _fail(f"cannot start {command[0]}: {e.strerror}", 1)
