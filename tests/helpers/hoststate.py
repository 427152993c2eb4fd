"""A snapshot of the host state chaoskit can change, read with the system's own tools (tc, nft, losetup, /proc,
cgroupfs), so a test or bench can compare before and after a run and print what differs."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

from chaoskit.targets.cgroups import hierarchy_roots
from chaoskit.targets.process import proc_state

MARKERS = ("chaoskit-holder-", "chaoskit-proxy-", "chaoskit-gpuholder-", "chaoskit.engine.watchdog")


def _run(*argv: str) -> str:
    out = subprocess.run(argv, capture_output=True, text=True, timeout=30)
    return out.stdout if out.returncode == 0 else f"<{argv[0]} failed: {out.stderr.strip()[:200]}>"


def _netns() -> list[str]:
    try:
        return sorted(x["name"] for x in json.loads(_run("ip", "-j", "netns", "list") or "[]"))
    except ValueError:
        return []


def _in_ns(ns: str | None, *argv: str) -> str:
    return _run(*(("ip", "netns", "exec", ns) if ns else ()), *argv)


def _net(ns: str | None) -> dict[str, Any]:
    links = json.loads(_in_ns(ns, "ip", "-j", "link", "show") or "[]")
    qdiscs = _in_ns(ns, "tc", "-j", "qdisc", "show")
    filters = {link["ifname"]: _in_ns(ns, "tc", "-j", "filter", "show", "dev", link["ifname"], "ingress")
               for link in links}
    nft = _in_ns(ns, "nft", "-j", "list", "ruleset")
    return {"links": sorted(x["ifname"] for x in links), "qdiscs": qdiscs, "ingress_filters": filters, "nft": nft}


def _chaoskit_cgroups() -> list[str]:
    return sorted(str(p) for root in hierarchy_roots() for p in root.glob("chaoskit-*"))


def _chaoskit_processes() -> list[str]:
    out = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                cmd = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            if any(m in cmd for m in MARKERS):
                out.append(cmd.strip()[:200])
    return sorted(out)


def snapshot(pids: list[int] = (), state_dir: Path | None = None, namespaces: list[str] | None = None) -> dict:
    """Everything chaoskit may change: per namespace (the root one and `namespaces`, default all) links,
    qdiscs, ingress filters and nft ruleset; chaoskit-* cgroups; chaoskit's helper processes; open ledgers;
    loop devices; mounts; the signal state of the target processes."""
    nss = _netns() if namespaces is None else namespaces
    snap: dict[str, Any] = {"net": {ns or "<root>": _net(ns) for ns in [None, *nss]},
                            "cgroups": _chaoskit_cgroups(), "processes": _chaoskit_processes(),
                            "loop": _run("losetup", "-J"), "mounts": len(Path("/proc/self/mounts").read_text().splitlines()),
                            "targets": {pid: "stopped" if proc_state(pid) == "T" else "running" for pid in pids}}
    if state_dir is not None:
        ledgers = sorted((state_dir / "ledgers").glob("*.jsonl")) if (state_dir / "ledgers").is_dir() else []
        snap["open_ledgers"] = [p.name for p in ledgers if '"op":"closed"' not in p.read_text()]
    return snap


def diff(before: dict, after: dict, path: str = "") -> list[str]:
    """Readable differences, one line each."""
    if isinstance(before, dict) and isinstance(after, dict):
        out = []
        for k in sorted(set(before) | set(after), key=str):
            out += diff(before.get(k), after.get(k), f"{path}/{k}")
        return out
    return [] if before == after else [f"{path}: {before!r} -> {after!r}"[:600]]
