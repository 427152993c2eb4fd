"""A real tiny-openai replica (and tiny-mcp when asked) with an llm.proxy in front: started, and on the way out
stopped and checked to leave no proxy process and nothing lingering."""

from __future__ import annotations

import signal
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from chaoskit.injectors.llm_proxy.fault import LlmProxy
from chaoskit.targets.process import all_pids, cmdline
from tests.conftest import free_port, wait_for


@dataclass(frozen=True)
class AgentStack:
    up: int  # tiny-openai's port
    proxy: int  # llm.proxy's, in front of it
    logs: Path  # replica.jsonl (and mcp.jsonl) here
    mcp: str | None  # tiny-mcp's URL when started


def answers(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1):
            return True
    except OSError:
        return False


def stop(procs: list[subprocess.Popen]) -> list[int]:
    """SIGTERM each; the pids of those still running 10 s later (then killed)."""
    for p in procs:
        p.send_signal(signal.SIGTERM)
    lingered = []
    for p in procs:
        try:
            p.wait(10)
        except subprocess.TimeoutExpired:
            lingered.append(p.pid)
            p.kill()
            p.wait()
    return lingered


@contextmanager
def agent_stack(logs: Path, faults: list[dict[str, Any]], seed: int, mcp: bool = False) -> Iterator[AgentStack]:
    """tiny-openai (and tiny-mcp) logging their requests under `logs`, llm.proxy in front of tiny-openai with
    `faults`; at the end the proxy reverted, the servers stopped (whatever the revert did), then checked."""
    up, mport = free_port(), free_port()
    procs = [subprocess.Popen([sys.executable, "-m", "chaoskit.reference.tiny_openai", "--port", str(up),
                               "--token-rate", "1000", "--log", str(logs / "replica.jsonl")])]
    if mcp:
        procs.append(subprocess.Popen([sys.executable, "-m", "chaoskit.reference.tiny_mcp", "--port", str(mport),
                                       "--log", str(logs / "mcp.jsonl")]))
    rec = None
    try:
        wait_for(lambda: answers(up) and (not mcp or answers(mport)), timeout=30, every=0.1)
        port = free_port()
        inj = LlmProxy(LlmProxy.Spec(type="llm.proxy", listen=f"127.0.0.1:{port}", upstream=f"127.0.0.1:{up}",
                                     faults=faults, seed=seed))
        inj.ctx.lifetime_s = 300
        inj.preflight()
        rec = inj.apply(inj.prepare())
        yield AgentStack(up, port, logs, f"http://127.0.0.1:{mport}/mcp" if mcp else None)
    finally:
        try:
            if rec is not None:
                LlmProxy.revert(rec)
        finally:
            lingered = stop(procs)
        if rec is not None:
            assert not LlmProxy.observe(rec)
            assert not [p for p in all_pids() if rec.token in cmdline(p)]
        assert not lingered
