"""A process that makes CUDA driver calls on request, for the interposer tests: reads a count from stdin, makes
that many allocate+free, kernel launch and synchronise calls, prints how many of each returned an error (JSON).

`way` says how it reaches the driver: `dlsym` (ctypes looks each symbol up by name, as hand-written loaders do)
or `procaddress` (cuGetProcAddress_v2 hands out the entry points, as the CUDA runtime does since 11.3).
Runs against $CHAOSKIT_LIBCUDA (the simulated driver in the tests). `Driver` is the tests' side of it.
"""

from __future__ import annotations

import ctypes
import json
import os
import subprocess
import sys
from collections.abc import Callable

c_ull, c_int, c_void_p, c_size_t = ctypes.c_ulonglong, ctypes.c_int, ctypes.c_void_p, ctypes.c_size_t
SIGNATURES = {
    "cuMemAlloc": (c_int, ctypes.POINTER(c_ull), c_size_t),
    "cuMemFree": (c_int, c_ull),
    "cuLaunchKernel": (c_int, c_void_p, *[ctypes.c_uint] * 7, c_void_p, c_void_p, c_void_p),
    "cuCtxSynchronize": (c_int,),
}


class Driver:
    """A test's handle on a started workload process (stdin and stdout pipes, text): waits for it to be ready;
    `calls(n)` makes n calls of each kind and returns the errors seen, per kind; `stop()` ends it."""

    def __init__(self, proc: subprocess.Popen):
        self.proc = proc
        assert proc.stdout.readline().strip() == "ready"

    def calls(self, n: int) -> dict[str, dict[str, int]]:
        self.proc.stdin.write(f"{n}\n")
        self.proc.stdin.flush()
        return json.loads(self.proc.stdout.readline())

    def stop(self) -> None:
        self.proc.stdin.close()  # its loop ends
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def entry_points(lib: ctypes.CDLL, way: str) -> dict[str, Callable[..., int]]:
    if way == "dlsym":
        names = {"cuMemAlloc": "cuMemAlloc_v2", "cuMemFree": "cuMemFree_v2"}
        return {base: ctypes.CFUNCTYPE(*sig)((names.get(base, base), lib)) for base, sig in SIGNATURES.items()}
    get = lib.cuGetProcAddress_v2
    get.argtypes = [ctypes.c_char_p, ctypes.POINTER(c_void_p), c_int, c_ull, ctypes.POINTER(c_int)]
    out = {}
    for base, sig in SIGNATURES.items():
        fn = c_void_p()
        assert get(base.encode(), ctypes.byref(fn), 12000, 0, None) == 0, base
        out[base] = ctypes.CFUNCTYPE(*sig)(fn.value)
    return out


def main() -> None:
    lib = ctypes.CDLL(os.environ["CHAOSKIT_LIBCUDA"])
    assert lib.cuInit(0) == 0
    f = entry_points(lib, sys.argv[1])
    print("ready", flush=True)
    for line in sys.stdin:
        n = int(line)
        errors = {"alloc": {}, "launch": {}, "sync": {}}
        for _ in range(n):
            ptr = c_ull()
            e = f["cuMemAlloc"](ctypes.byref(ptr), 1 << 20)
            if e == 0:
                f["cuMemFree"](ptr)
            for kind, code in (("alloc", e), ("launch", f["cuLaunchKernel"](1, 1, 1, 1, 1, 1, 1, 0, None, None, None)),
                               ("sync", f["cuCtxSynchronize"]())):
                if code:
                    errors[kind][str(code)] = errors[kind].get(str(code), 0) + 1
        print(json.dumps(errors), flush=True)


if __name__ == "__main__":
    main()
