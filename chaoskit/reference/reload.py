"""Reload one model of a Triton replica (explicit model control: unload, wait, load) and print the seconds
the load took. For `command` probes: `python -m chaoskit.reference.reload URL MODEL` -> stdout_number."""

from __future__ import annotations

import json
import sys
import time
import urllib.error
import urllib.request


def _post(url: str, timeout: float) -> int:
    req = urllib.request.Request(url, data=b"{}", method="POST", headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code


def _ready(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as r:
            return r.status == 200
    except (urllib.error.URLError, OSError):
        return False


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: python -m chaoskit.reference.reload TRITON_URL MODEL", file=sys.stderr)
        return 2
    base, model = argv[0].rstrip("/"), argv[1]
    if _post(f"{base}/v2/repository/models/{model}/unload", 30) != 200:
        print(f"unload of {model} refused", file=sys.stderr)
        return 1
    deadline = time.monotonic() + 30
    while _ready(f"{base}/v2/models/{model}/ready") and time.monotonic() < deadline:
        time.sleep(0.05)
    t0 = time.monotonic()
    status = _post(f"{base}/v2/repository/models/{model}/load", 120)
    took = time.monotonic() - t0
    if status != 200:
        print(json.dumps({"error": f"load of {model} failed: HTTP {status}"}), file=sys.stderr)
        return 1
    print(f"{took:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
