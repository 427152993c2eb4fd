"""`python -m chaoskit.agent apply|revert|observe`: run one injector verb on this node (inside a helper pod).

The request is JSON — `{"type": ..., "record": {...}, "spec": {...}, "placement": {...}}` (`spec` and
`placement` for apply only; a placement naming a pod makes the spec's `kubernetes:` target that container's
PIDs, or its cgroup for a cgroup limit) — read from a file (`--file PATH`), stdin (`--file -`, the default) or an environment variable (`--env NAME`, how the k8s-helper
executor passes it). The answer is one JSON line on stdout: apply `{"record": final}`, revert `{"reverted": true}`,
observe `{"in_effect": bool, "details": {...}}`; a failure is `{"error": "..."}` and exit status 1. An apply
with `"hold_s": S` stays after answering and reverts the fault on SIGTERM or after S seconds (then prints
`{"reverted": true, "why": "SIGTERM"|"deadline"}`).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
from typing import Any

from chaoskit.executors.layer import localize_on_node
from chaoskit.executors.local import LocalExecutor
from chaoskit.injectors import injector_class

VERBS = ("apply", "revert", "observe")


def run(verb: str, request: dict[str, Any]) -> dict[str, Any]:
    """Do `verb` with the local injector code; the answer object."""
    local, type_name, record = LocalExecutor(), request["type"], request.get("record") or {}
    if verb == "apply":
        return {"record": apply(type_name, request["spec"], record, (request.get("placement") or {}).get("target"))}
    if verb == "revert":
        local.revert(type_name, record, None)
        return {"reverted": True}
    return {"in_effect": local.observe(type_name, record, None),
            "details": local.observe_details(type_name, record, None)}


def apply(type_name: str, spec: dict[str, Any], record: dict[str, Any], pod: dict[str, Any] | None) -> dict[str, Any]:
    """Apply on this node. For a chosen pod (`pod`, a targets.kube.Placement) the spec's kubernetes target
    becomes its container's PIDs (or cgroup), and the fault is checked and prepared here; one that fails halfway is
    reverted before the error is answered."""
    cls = injector_class(type_name)
    if pod is not None:
        spec = localize_on_node(cls, spec, pod["container_id"])
    injector = cls(cls.Spec.model_validate(spec))
    if record:  # prepared by the caller (one fault on one node)
        return injector.apply(record)
    injector.preflight()
    record = injector.prepare()
    try:
        return injector.apply(record)
    except BaseException:
        cls.revert(record)
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
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())  # never killed halfway through a verb
    try:
        request = read_request(args)
        answer = run(args.verb, request)
    except Exception as e:  # one clear line for the executor to report, never a traceback
        print(json.dumps({"error": f"{type(e).__name__}: {e}"}), flush=True)
        return 1
    print(json.dumps(answer, separators=(",", ":"), default=str), flush=True)
    hold_s = float(request.get("hold_s") or 0)
    return hold(request["type"], answer["record"], hold_s, stop) if args.verb == "apply" and hold_s > 0 else 0


def hold(type_name: str, record: dict[str, Any], seconds: float, stop: threading.Event) -> int:
    """Stay with an applied fault and revert it on SIGTERM (the pod deleted, or past its activeDeadlineSeconds)
    or once `seconds` have passed, whichever comes first: a fault never outlives its lifetime on the node."""
    why = "SIGTERM" if stop.wait(seconds) else "deadline"
    try:
        injector_class(type_name).revert(record)
    except Exception as e:
        print(json.dumps({"error": f"revert at {why}: {type(e).__name__}: {e}"}), flush=True)
        return 1
    print(json.dumps({"reverted": True, "why": why}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
