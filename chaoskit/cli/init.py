"""`chaoskit init --url URL`: detect what serves there and write a first, commented experiment for it."""

from __future__ import annotations

import re
import shlex
import socket
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn
from urllib.parse import urlsplit

import typer
from rich.markup import escape

from chaoskit.errors import ChaoskitError
from chaoskit.term import console

if TYPE_CHECKING:
    from chaoskit.init_template import Plan

out = console()
err = console(stderr=True)

_NAME = re.compile(r"^[A-Za-z0-9_.\-]+$")
PROXY_PORTS = range(18100, 18200)  # below the ephemeral range, so the port is likely still free at run time


def _fail(message: str) -> NoReturn:
    err.print(f"[red]error:[/] {escape(message)}", highlight=False, soft_wrap=True)
    raise typer.Exit(ChaoskitError.exit_code)


def init(
    url: str = typer.Option(..., "--url", help="the service's root, e.g. http://127.0.0.1:8000"),
    name: str = typer.Option("first-experiment", "--name", help="the experiment's name (letters, digits, . _ -)"),
    out_file: Path | None = typer.Option(None, "--out", help="where to write (default: NAME.yaml here)"),
    pid: int | None = typer.Option(None, "--pid", help="fault: pause this process (SIGSTOP) instead of a proxy"),
    process_name: str | None = typer.Option(None, "--process-name", help="fault: pause the processes whose name "
                                            "(comm) matches this regex instead of a proxy"),
    force: bool = typer.Option(False, "--force", help="overwrite the file if it exists"),
) -> None:
    """Write a first experiment for your own service: detect what answers at --url (OpenAI-compatible, Triton,
    plain HTTP), then a health probe, a gentle SLO load, one safe fault (a 5% 503 storm by a proxy in front of
    it, or with --pid/--process-name a 5 s SIGSTOP pause), a safeguard, all explained in comments."""
    from chaoskit.init_detect import detect
    from chaoskit.init_template import Plan, render

    base = _base_url(url, signal=pid is not None or process_name is not None)
    _check_args(name, pid, process_name)
    target = out_file or Path(f"{name}.yaml")
    if target.exists() and not force:
        _fail(f"{target} exists; choose another --out, or --force to overwrite it")
    found = detect(base)
    matched = _processes(pid, process_name)
    shown = shlex.quote(str(target)) if str(target).isprintable() else "THIS_FILE"
    plan = Plan(base, name, found, pid=pid, process_name=process_name, file=shown)
    if process_name is not None and not matched:
        plan.todos.append(f"no running process's name matches /{process_name}/ now: `chaoskit run` (and "
                          "--dry-run) refuse with exit 4 until one does")
    if not plan.signal:
        plan.proxy_port = free_port(avoid=urlsplit(base).port)
    _write(target, render(plan))
    _report(target, plan, matched)


def _base_url(url: str, signal: bool) -> str:
    """http://host:port of --url (exit 2 if it is not one)."""
    parts = urlsplit(url.strip())
    if parts.scheme not in ("http", "https") or not parts.hostname:
        _fail(f"--url {url}: expected http://host:port")
    if parts.path not in ("", "/") or parts.query or parts.fragment:
        _fail(f"--url {url}: give the server's root (http://host:port), without a path: the probes add "
              "/v1/models, /v2/health/ready ...")
    if "{" in url or "}" in url:
        _fail(f"--url {url}: braces are not allowed in a URL")
    if parts.scheme == "https" and not signal:
        _fail(f"--url {url}: the llm.proxy fault speaks plain HTTP to its upstream; give an http:// URL, or "
              "pause a process instead (--pid or --process-name)")
    if "@" in parts.netloc:
        _fail(f"--url {url}: credentials in the URL are not supported")
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError:
        _fail(f"--url {url}: the port is not a number 1..65535")
    host = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname
    return f"{parts.scheme}://{host}:{port}"


def _check_args(name: str, pid: int | None, process_name: str | None) -> None:
    if not _NAME.match(name):
        _fail(f"--name {name!r}: use letters, digits, '.', '_' and '-' only")
    if pid is not None and process_name is not None:
        _fail("--pid and --process-name both name the process to pause; give one")
    if pid is not None and (pid <= 0 or not Path(f"/proc/{pid}").is_dir()):
        _fail(f"--pid {pid}: no running process with that PID")
    if process_name is not None:
        if not process_name.isprintable():
            _fail(f"--process-name {process_name!r}: control characters are not allowed")
        try:
            re.compile(process_name)
        except re.error as e:
            _fail(f"--process-name {process_name!r}: not a regular expression ({e})")


def _processes(pid: int | None, process_name: str | None) -> list[str]:
    """'PID (comm)' of the processes the fault would pause now (exit 2 for one chaoskit refuses to pause)."""
    if pid is None and process_name is None:
        return []
    from chaoskit.injectors.process.fault import protected_pids, select_processes

    if pid is not None and pid in protected_pids():
        _fail(f"--pid {pid}: PID 1 or an ancestor of this command (your shell): chaoskit refuses to pause it")
    return [f"{r.pid} ({r.comm})" for r in select_processes(pid, process_name)]


def free_port(avoid: int | None = None) -> int:
    """A port free on 127.0.0.1 now, from PROXY_PORTS if one is (else any the kernel gives)."""
    from chaoskit.reference.deploy import port_free  # lazily: every command imports this module

    for port in PROXY_PORTS:
        if port != avoid and port_free("127.0.0.1", port):
            return port
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _write(target: Path, text: str) -> None:
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text, encoding="utf-8")
    except OSError as e:
        _fail(f"{target}: cannot write: {e.strerror or e}")


def _report(target: Path, plan: Plan, matched: list[str]) -> None:
    f = plan.found
    if f.kind:
        model = f", model {f.model}" if f.model else ""
        out.print(escape(f"detected {f.kind} at {plan.url}{model} ({f.evidence})"), highlight=False)
    else:
        out.print(f"[yellow]could not detect[/] what serves {escape(plan.url)}: wrote a template (OpenAI-compatible "
                  "shape); edit the lines marked TODO", highlight=False)
    for note in f.notes:
        out.print(f"  [yellow]not detected:[/] {escape(note)}", highlight=False)
    who = f"PID {plan.pid}" if plan.pid is not None else f"the processes named /{plan.process_name}/"
    fault = (f"process.signal SIGSTOP of {who} for 5 s"
             if plan.signal else f"llm.proxy on 127.0.0.1:{plan.proxy_port}, 5% of requests answered 503 "
             f"(point a client at http://127.0.0.1:{plan.proxy_port} to meet it)")
    out.print(f"wrote {escape(str(target))}: {escape(fault)}", highlight=False)
    for todo in plan.todos:
        out.print(f"  [yellow]note:[/] {escape(todo)}", highlight=False)
    if plan.process_name is not None and matched:
        more = f" and {len(matched) - 5} more" if len(matched) > 5 else ""
        out.print(escape(f"  /{plan.process_name}/ matches now: {', '.join(matched[:5])}{more}"), highlight=False)
    out.print("next:", highlight=False)
    for cmd in (f"chaoskit validate {plan.file}", f"chaoskit run --dry-run {plan.file}", f"chaoskit run {plan.file}"):
        out.print(f"  {escape(cmd)}", highlight=False)
