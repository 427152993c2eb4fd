"""`python -m chaoskit.agent apply|revert|observe`: run one injector verb on this node (inside a helper pod).

The request is JSON — `{"type": ..., "record": {...}, "spec": {...}, "placement": {...}}` (`spec` for apply
only) — read from a file (`--file PATH`), stdin (`--file -`, the default) or an environment variable (`--env
NAME`, how the k8s-helper executor passes it). A placement of one node's pods (`on_node`, `targets`: one helper
per node) runs the verb for each of them: the spec's `kubernetes:` target becomes each container's PIDs, or its
cgroup for a cgroup limit, and the record is `{"pods": [{"pod": NAME, "record": {...}}, ...]}`. The answer is one
JSON line on stdout: apply `{"record": final}`, revert `{"reverted": true}` (with `pods`: NAME -> reverted, or
skipped when the pod's container is gone from the node), observe `{"in_effect": bool, "details": {...}}` (with
`pods`: NAME -> details); a failure is `{"error": "..."}` and exit status 1. An apply with `"hold_s": S` stays
after answering and reverts the fault on SIGTERM or after S seconds (then prints `{"reverted": true, "why":
"SIGTERM"|"deadline"}`). When its pod mounts a service account volume (`$CHAOSKIT_API_CREDENTIALS` names it:
k8s_pods.API_DIR) it also reads the cluster's halt lever every LEVER_POLL_S through the in-cluster config, and
reverts at once when it is pulled (`"why": "halted: WHERE by WHO at WHEN: WHY"`), even when the run that started
it is gone. A lever that cannot be read (RBAC, the API server unreachable) is said once
(`{"lever": "cannot be read; ...", "where": ..., "why": ...}`) and the fault is held on: only SIGTERM or the
deadline end it then.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
from dataclasses import dataclass, field
from typing import Any

from chaoskit.executors.k8s_halt import HALT_NAMESPACE, HaltLever, in_cluster_core, read_lever
from chaoskit.executors.k8s_pods import API_ENV
from chaoskit.executors.layer import localize_on_node
from chaoskit.executors.local import LocalExecutor
from chaoskit.injectors import injector_class
from chaoskit.injectors.base import FaultContext

VERBS = ("apply", "revert", "observe")
LEVER_POLL_S = 2.0  # a holding agent reads the cluster's halt lever this often (a run: each safeguard interval)


class PodFailed(RuntimeError):
    """The verb failed on one of the node's pods (the others were reverted, or reverted anyway)."""


def run(verb: str, request: dict[str, Any]) -> dict[str, Any]:
    """Do `verb` with the local injector code; the answer object."""
    local, type_name, record = LocalExecutor(), request["type"], request.get("record") or {}
    placement = request.get("placement") or {}
    if placement.get("on_node"):
        return run_pods(verb, request, placement.get("targets") or [])
    if verb == "apply":
        return {"record": apply(type_name, request["spec"], record, placement.get("target"), lifetime(request))}
    if verb == "revert":
        local.revert(type_name, record, None)
        return {"reverted": True}
    return {"in_effect": local.observe(type_name, record, None),
            "details": local.observe_details(type_name, record, None)}


def run_pods(verb: str, request: dict[str, Any], pods: list[dict[str, Any]]) -> dict[str, Any]:
    """`verb` for each chosen pod of this node (its share of the fault)."""
    type_name, record = request["type"], request.get("record") or {}
    if verb == "apply":
        return {"record": apply_pods(type_name, request["spec"], pods, lifetime(request))}
    if verb == "revert":
        return {"reverted": True, "pods": revert_pods(type_name, record, pods)}
    return observe_pods(type_name, record)


def lifetime(request: dict[str, Any]) -> float | None:
    """How long the fault may live on this node: the run's lifetime for it (the apply's hold), None if not said."""
    return float(request.get("hold_s") or 0) or None


def apply_pods(type_name: str, spec: dict[str, Any], pods: list[dict[str, Any]],
               lifetime_s: float | None = None) -> dict[str, Any]:
    """Apply to each pod in turn; the node's record lists each pod's. If one fails, those already applied here
    are reverted (newest first) before PodFailed names it."""
    done: list[dict[str, Any]] = []
    for pod in pods:
        try:
            done.append({"pod": pod["pod"], "record": apply(type_name, spec, {}, pod, lifetime_s)})
        except Exception as e:
            left = _undo(type_name, done)
            raise PodFailed(f"pod {pod['namespace']}/{pod['pod']}: {type(e).__name__}: {e}" + (
                f" (and reverting pod(s) {left} of this node failed: revert them by hand)" if left else "")) from e
    return {"pods": done}


def _undo(type_name: str, done: list[dict[str, Any]]) -> str:
    """Revert the pods applied before a failure, newest first; the names of those whose revert failed."""
    left = []
    cls = injector_class(type_name)
    for entry in reversed(done):
        try:
            cls.revert(cls.from_ledger(entry["record"]))
        except Exception as e:
            left.append(f"{entry['pod']} ({type(e).__name__}: {e})")
    return ", ".join(left)


def revert_pods(type_name: str, record: dict[str, Any], pods: list[dict[str, Any]]) -> dict[str, str]:
    """Revert each pod's record, every one even if another fails: pod -> `reverted`, or `skipped: ...` for one
    whose revert failed because its container is gone from this node (the fault went with it). PodFailed naming
    the others that failed."""
    ids = {p["pod"]: p.get("container_id") or "" for p in pods}
    out: dict[str, str] = {}
    failed = []
    cls = injector_class(type_name)
    for entry in record.get("pods", []):
        try:
            cls.revert(cls.from_ledger(entry["record"]))
            out[entry["pod"]] = "reverted"
        except Exception as e:
            why = f"{type(e).__name__}: {e}"
            if container_gone(ids.get(entry["pod"], "")):
                out[entry["pod"]] = f"skipped: its container is gone from this node ({why})"
            else:
                failed.append(f"pod {entry['pod']}: {why}")
    if failed:
        raise PodFailed("; ".join(failed) + f" ({len(out)} other pod(s) of this node reverted)")
    return out


def container_gone(container_id: str) -> bool:
    """No process of the container runs on this node (the pod was deleted or moved); False if unknown."""
    from chaoskit.targets.container import ContainerNotFound, container_pids

    if not container_id:
        return False
    try:
        container_pids(container_id)
    except ContainerNotFound:
        return True
    return False


def observe_pods(type_name: str, record: dict[str, Any]) -> dict[str, Any]:
    """Each pod's details and whether its fault is in effect (one that cannot be looked at: not, and why)."""
    cls, pods = injector_class(type_name), {}
    for entry in record.get("pods", []):
        try:
            r = cls.from_ledger(entry["record"])
            pods[entry["pod"]] = {**cls.observe_details(r), "in_effect": bool(cls.observe(r))}
        except Exception as e:
            pods[entry["pod"]] = {"in_effect": False, "error": f"{type(e).__name__}: {e}"}
    return {"in_effect": any(d["in_effect"] for d in pods.values()), "details": {"pods": pods}}


def apply(type_name: str, spec: dict[str, Any], record: dict[str, Any], pod: dict[str, Any] | None,
          lifetime_s: float | None = None) -> dict[str, Any]:
    """Apply on this node. For a chosen pod (`pod`, a targets.kube.Placement) the spec's kubernetes target
    becomes its container's PIDs (or cgroup), and the fault is checked and prepared here; one that fails halfway is
    reverted before the error is answered. `lifetime_s`: what the fault's own helpers (and a CUDA fault's arming)
    are told to live at most, as on the run's host."""
    cls = injector_class(type_name)
    here = localize_on_node(cls, spec, pod["container_id"]) if pod is not None else cls.Spec.model_validate(spec)
    injector = cls(here, FaultContext(lifetime_s=lifetime_s) if lifetime_s else None)
    if record:  # prepared by the caller (one fault on one node)
        return cls.to_ledger(injector.apply(cls.from_ledger(record)))
    injector.preflight()
    prepared = injector.prepare()
    try:
        return cls.to_ledger(injector.apply(prepared))
    except BaseException:
        cls.revert(prepared)
        raise


def read_request(args: argparse.Namespace) -> dict[str, Any]:
    if args.env:
        text = os.environ.get(args.env)
        if text is None:
            raise ValueError(f"environment variable {args.env} is not set")
    elif args.file == "-":
        text = sys.stdin.read()
    else:
        with open(args.file, encoding="utf-8") as f:
            text = f.read()
    request = json.loads(text)
    if not isinstance(request, dict) or "type" not in request:
        raise ValueError("the request must be a JSON object with a 'type'")
    return request


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m chaoskit.agent", description=__doc__.splitlines()[0])
    parser.add_argument("verb", choices=VERBS)
    source = parser.add_mutually_exclusive_group()
    source.add_argument("--file", default="-", help="request JSON file ('-': stdin)")
    source.add_argument("--env", help="environment variable holding the request JSON")
    args = parser.parse_args(argv)
    stop = Stop()
    signal.signal(signal.SIGTERM, lambda *_: stop.set("SIGTERM"))  # never killed halfway through a verb
    try:
        request = read_request(args)
        answer = run(args.verb, request)
    except Exception as e:  # one clear line for the executor to report, never a traceback
        say({"error": f"{type(e).__name__}: {e}"})
        return 1
    print(json.dumps(answer, separators=(",", ":"), default=str), flush=True)
    hold_s = float(request.get("hold_s") or 0)
    return hold(request, answer["record"], hold_s, stop) if args.verb == "apply" and hold_s > 0 else 0


@dataclass
class Stop:
    """Why a hold ends, set from the SIGTERM handler or the lever's watcher (the first reason stays)."""

    event: threading.Event = field(default_factory=threading.Event)
    why: str = ""

    def set(self, why: str) -> None:
        self.why = self.why or why
        self.event.set()


def say(obj: dict[str, Any]) -> None:
    """One JSON line on stdout (the pod's log), in one write: the lever thread and the main thread both say."""
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def hold(request: dict[str, Any], record: dict[str, Any], seconds: float, stop: Stop) -> int:
    """Stay with an applied fault and revert it on SIGTERM (the pod deleted, or past its activeDeadlineSeconds),
    when the cluster's halt lever is pulled, or once `seconds` have passed, whichever comes first: a fault never
    outlives its lifetime on the node."""
    credentials = os.environ.get(API_ENV)
    if credentials:
        threading.Thread(target=watch_lever, args=(credentials, lever_namespaces(request), stop), daemon=True,
                         name="halt-lever").start()
    why = (stop.why or "SIGTERM") if stop.event.wait(seconds) else "deadline"
    try:
        run("revert", {**request, "record": record})
    except Exception as e:
        say({"error": f"revert at {why}: {type(e).__name__}: {e}"})
        return 1
    say({"reverted": True, "why": why})
    return 0


def lever_namespaces(request: dict[str, Any]) -> list[str]:
    """Where the lever is looked for: namespace `chaoskit`, and the helper's own (as a run looks: app.halt)."""
    return sorted({HALT_NAMESPACE, (request.get("placement") or {}).get("namespace") or HALT_NAMESPACE})


def watch_lever(credentials: str, namespaces: list[str], stop: Stop) -> None:
    """Read the lever now and every LEVER_POLL_S until the hold ends; a pulled one ends it (`halted: ...`). Never
    raises: a lever that cannot be read is said once per namespace and looked at again at the next poll."""
    core, unreadable = None, set()
    while not stop.event.is_set():
        for ns in namespaces:
            try:
                core = core or in_cluster_core(credentials)
                lever: HaltLever | None = read_lever(core, ns)
            except Exception as e:  # RBAC, the API server unreachable, not in a pod: hold on, say it once
                if ns not in unreadable:
                    unreadable.add(ns)
                    say({"lever": "cannot be read; holding until SIGTERM or the deadline", "where": f"in namespace {ns}",
                         "why": short_error(e)})
                continue
            if lever is not None:
                stop.set(f"halted: {lever.describe()}")
                return
        stop.event.wait(LEVER_POLL_S)


def short_error(e: Exception) -> str:
    """An API error as `403 Forbidden`, anything else as `Type: message` (one line, at most 200 characters)."""
    status = getattr(e, "status", None)
    text = f"{status} {getattr(e, 'reason', '')}".strip() if status else f"{type(e).__name__}: {e}"
    return " ".join(text.split())[:200]


if __name__ == "__main__":
    sys.exit(main())
