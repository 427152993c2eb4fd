"""The light OpenAI-compatible replicas (engine tiny-openai) and a third-party gateway in front of replicas:
started as processes of a reference deployment, waited for until they really serve."""

from __future__ import annotations

import os
import shutil
import socket
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from chaoskit.errors import ChaoskitError, PreflightError
from chaoskit.reference import gateways
from chaoskit.reference.gateways.base import Upstream
from chaoskit.reference.httpcheck import http_status
from chaoskit.reference.options import RefOptions
from chaoskit.reference.tiny_openai import SERVED_NAME


class Deployment(Protocol):
    """What these starters need of chaoskit.reference.deploy.Deployment."""

    root: Path
    logs: Path

    def spawn(self, name: str, argv: list[str], env: dict[str, str] | None = None) -> dict[str, Any]: ...
    def wait_ready(self, name: str, ready: Callable[[], bool], pid: int) -> None: ...
    def subnet_base(self, count: int, port: int) -> int: ...
    def create_netns(self, i: int, octet: int) -> tuple[str, str]: ...


PROBE = {"model": SERVED_NAME, "prompt": "ready?", "max_tokens": 1}


def start_replicas(dep: Deployment, opts: RefOptions, say: Callable[[str], None]) -> list[dict[str, Any]]:
    """opts.replicas tiny-openai servers, each logging its requests to logs/NAME.requests.jsonl."""
    replicas = []
    base = dep.subnet_base(opts.replicas, opts.port) if opts.netns else 0
    rate = opts.model_settings().get("token_rate", "200")
    context = opts.model_settings().get("max_context", "4096")
    for i in range(opts.replicas):
        name, port = f"tiny-openai-{i}", opts.port + 1 + 3 * i
        ns, host = (dep.create_netns(i, base + i) if opts.netns else (None, "127.0.0.1"))
        log = dep.logs / f"{name}.requests.jsonl"
        argv = [sys.executable, "-m", "chaoskit.reference.tiny_openai", "--host", host, "--port", str(port),
                "--name", name, "--token-rate", rate, "--max-context", context, "--log", str(log)]
        p = dep.spawn(name, [shutil.which("ip") or "/usr/sbin/ip", "netns", "exec", ns, *argv] if ns else argv)
        url = f"http://{host}:{port}"
        replicas.append({"name": name, "pid": p["pid"], "host": host, "port": port, "url": url,
                         "metrics_url": f"{url}/stats", "netns": ns, "request_log": str(log)})
    for r in replicas:
        dep.wait_ready(r["name"], lambda r=r: http_status(f"{r['url']}/v1/completions", PROBE, 5) == 200, r["pid"])
        say(f"{r['name']} ready at {r['url']} (pid {r['pid']})")
    return replicas


def start_gateway(dep: Deployment, opts: RefOptions, replicas: list[dict[str, Any]], probe: dict[str, Any],
                  say: Callable[[str], None]) -> dict[str, Any]:
    """The gateway `opts.gateway` over the replicas, on opts.port (its metrics, if any, on the port after the
    replicas' block); its facts: kind, version, pid, URL, configuration file and settings."""
    kind = gateways.kind(opts.gateway)
    if not kind.installed():
        raise ChaoskitError(f"gateway {kind.name} is not installed: run `chaoskit ref install gateway-{kind.name}` "
                            f"(installs {kind.package})")
    settings = kind.settings(opts.gateway_params)
    taps = start_tap(dep, replicas, aux_port(opts) + 1) if opts.tap else {}
    upstreams = [Upstream(r["name"], *taps.get(r["name"], (r["host"], r["port"]))) for r in replicas]
    launch = kind.launch(dep.root, upstreams, opts.port, aux_port(opts), settings, probe["model"])
    p = dep.spawn("gateway", launch.argv, {**os.environ, **launch.env})
    url = f"http://127.0.0.1:{opts.port}"
    dep.wait_ready("gateway", lambda: http_status(f"{url}/v1/completions", probe, timeout=30) == 200, p["pid"])
    facts = {"url": url, "pid": p["pid"], "kind": kind.name, "version": kind.version(), "package": kind.package,
             "config": str(launch.config) if launch.config else None, "settings": settings, "argv": launch.argv,
             "tap_log": str(tap_log(dep)) if taps else None,
             "tap_metrics": f"http://127.0.0.1:{aux_port(opts) + 1}/metrics" if taps else None}
    say(f"gateway {kind.name} {facts['version']} ready at {url} over {len(replicas)} replicas "
        f"({', '.join(f'{k}={v}' for k, v in settings.items())})")
    return facts


def start_tap(dep: Deployment, replicas: list[dict[str, Any]], metrics_port: int) -> dict[str, tuple[str, int]]:
    """The counting pass-through (chaoskit.reference.tap) in front of each replica, on the port after the
    replica's, its counters on metrics_port; {replica name: (host, port) the gateway is given instead}."""
    routes = {r["name"]: ("127.0.0.1", r["port"] + 1) for r in replicas}
    argv = [sys.executable, "-m", "chaoskit.reference.tap", "--log", str(tap_log(dep)), f"--metrics={metrics_port}",
            *(f"--route={r['name']}={routes[r['name']][1]}={r['host']}:{r['port']}" for r in replicas)]
    p = dep.spawn("tap", argv)
    dep.wait_ready("tap", lambda: all(listening(*hp) for hp in routes.values()), p["pid"])
    return routes


def start_mcp(dep: Deployment, port: int, say: Callable[[str], None]) -> dict[str, Any]:
    """tiny-mcp (chaoskit.reference.tiny_mcp) on 127.0.0.1:port, logging each tool call; its facts."""
    log = dep.logs / "tiny-mcp.requests.jsonl"
    argv = [sys.executable, "-m", "chaoskit.reference.tiny_mcp", "--port", str(port), "--log", str(log)]
    p = dep.spawn("tiny-mcp", argv)
    url = f"http://127.0.0.1:{port}"
    dep.wait_ready("tiny-mcp", lambda: http_status(f"{url}/health", None, 5) == 200, p["pid"])
    say(f"tiny-mcp ready at {url}/mcp (pid {p['pid']})")
    return {"url": f"{url}/mcp", "pid": p["pid"], "port": port, "request_log": str(log)}


def check_mcp() -> None:
    """Before anything starts: tiny-mcp runs on the official MCP SDK (the `agents` extra)."""
    import importlib.util

    if importlib.util.find_spec("mcp") is None:
        raise PreflightError("--mcp needs the official MCP SDK: the agents extra of the chaoskit wheel "
                             "(pip install 'chaoskit-0.1.0-py3-none-any.whl[agents]') or pip install 'mcp==2.3.0'")


def tap_log(dep: Deployment) -> Path:
    return dep.logs / "tap.requests.jsonl"


def listening(host: str, port: int) -> bool:
    try:
        socket.create_connection((host, port), timeout=0.5).close()
        return True
    except OSError:
        return False


def aux_port(opts: RefOptions) -> int:
    """The port after the replicas' block (3 ports each): a gateway's second listener (the one after it: the
    tap's counters)."""
    return opts.port + 1 + 3 * opts.replicas
