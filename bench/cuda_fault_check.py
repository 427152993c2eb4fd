"""gpu.cuda_fault against the real CUDA driver (run by bench/gpu_check.sh on a machine with a GPU; about 30 s).

Standard library (+ PyTorch where installed). A child process runs with the interposer preloaded and makes real
driver calls on request: 2 MiB allocations, launches of an empty kernel (PTX, JIT-compiled by the driver),
synchronisations; reached by symbol lookup (ctypes), through cuGetProcAddress_v2 (the CUDA runtime's way), and
through PyTorch (the runtime, caching allocator off). The parent arms the control file, counts what failed, disarms,
and counts again. Changes no card setting.

RESULT keys (shares over N calls per kind; goal: the asked share +-0.03, 0 after revert):
  ctypes_alloc / ctypes_launch / procaddr_alloc / procaddr_launch   failed share while armed (asked 0.2 / 0.05)
  torch_alloc    share of torch.empty(2 MiB) that raised an out-of-memory error while armed (asked 0.2)
  torch_cached_alloc  the same with PyTorch's caching allocator on (empty_cache() after each, so each is new)
  torch_launch   share of x.add_(1) that raised while armed (asked 0.05; whether the context stays usable is
                 printed: `usable` is x[0] after a synchronize, or the error it raised)
  after_revert   failures of any kind after revert, summed over every child
  sync_delay_ms  mean added time per cuCtxSynchronize with delay 2 ms armed, minus the disarmed mean
  goal_met, missed=  the goals missed (unjudged=: torch's, where PyTorch is not installed)

Goals (GOALS below; exit 1 when one is missed; `--goal key=value` sets one for a run, see bench/goals.py): each
failed share within 0.03 of the asked one (the `*_error` goals: |share - asked|), nothing failing after revert.
torch_cached_alloc has no goal: the caching allocator retries a failed allocation once (about asked^2 is what a
service sees; docs/benchmarks.md). Without a CUDA driver it prints a RESULT line of nans and exits 1, as before.
"""

from __future__ import annotations

import ctypes
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from chaoskit.gpu import cuda_fault_ctl as ctl  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from goals import Goal, Goals  # noqa: E402

ASKED = {"alloc": 0.2, "launch": 0.05}
GOALS = Goals(*(Goal(f"{mode}_{kind}_error", "<=", 0.03, f"|{mode}_{kind} - {asked}|")
                for mode in ("ctypes", "procaddr", "torch") for kind, asked in ASKED.items()),
              Goal("after_revert", "<=", 0, "failures after revert, every child"))
N = 2000
PTX = b""".version 7.0
.target sm_50
.address_size 64
.visible .entry noop()
{
  ret;
}
"""


def _driver_child(way: str) -> None:
    c_ull, c_int, c_void_p = ctypes.c_ulonglong, ctypes.c_int, ctypes.c_void_p
    lib = ctypes.CDLL(os.environ.get("CHAOSKIT_LIBCUDA", "libcuda.so.1"))
    sigs = {"cuMemAlloc": (c_int, ctypes.POINTER(c_ull), ctypes.c_size_t), "cuMemFree": (c_int, c_ull),
            "cuLaunchKernel": (c_int, c_void_p, *[ctypes.c_uint] * 7, c_void_p, c_void_p, c_void_p),
            "cuCtxSynchronize": (c_int,)}
    if way == "ctypes":
        names = {"cuMemAlloc": "cuMemAlloc_v2", "cuMemFree": "cuMemFree_v2"}
        f = {b: ctypes.CFUNCTYPE(*s)((names.get(b, b), lib)) for b, s in sigs.items()}
    else:
        get = lib.cuGetProcAddress_v2
        get.argtypes = [ctypes.c_char_p, ctypes.POINTER(c_void_p), c_int, c_ull, ctypes.POINTER(c_int)]
        f = {}
        for b, s in sigs.items():
            p = c_void_p()
            assert get(b.encode(), ctypes.byref(p), 12000, 0, None) == 0, b
            f[b] = ctypes.CFUNCTYPE(*s)(p.value)
    dev, ctx, mod, fn = c_int(), c_void_p(), c_void_p(), c_void_p()
    assert lib.cuInit(0) == 0 and lib.cuDeviceGet(ctypes.byref(dev), 0) == 0
    assert lib.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev) == 0 and lib.cuCtxSetCurrent(ctx) == 0
    assert lib.cuModuleLoadData(ctypes.byref(mod), PTX) == 0
    assert lib.cuModuleGetFunction(ctypes.byref(fn), mod, b"noop") == 0
    print("ready", flush=True)
    for line in sys.stdin:
        n, errors, t_sync = int(line), {"alloc": 0, "launch": 0, "sync": 0}, 0.0
        for _ in range(n):
            ptr = c_ull()
            e = f["cuMemAlloc"](ctypes.byref(ptr), 2 << 20)
            errors["alloc"] += e != 0
            if e == 0:
                f["cuMemFree"](ptr)
            errors["launch"] += f["cuLaunchKernel"](fn, 1, 1, 1, 1, 1, 1, 0, None, None, None) != 0
            t = time.perf_counter()
            errors["sync"] += f["cuCtxSynchronize"]() != 0
            t_sync += time.perf_counter() - t
        print(json.dumps({**errors, "sync_ms": 1000 * t_sync / n}), flush=True)


def _torch_child(cached: bool) -> None:
    import torch

    torch.cuda.init()
    x = torch.zeros(1024, device="cuda")
    print("ready", flush=True)
    for line in sys.stdin:
        n, errors = int(line), {"alloc": 0, "launch": 0, "other": 0}
        for _ in range(n):
            try:
                torch.empty(2 << 20, dtype=torch.uint8, device="cuda")
                if cached:
                    torch.cuda.empty_cache()  # the caching allocator on: give the block back, so the next one is new
            except RuntimeError as e:  # OutOfMemoryError, or with the caching allocator off "CUDA error: out of memory"
                kind = "alloc" if "out of memory" in str(e) else "other"
                errors[kind] += 1
                errors.setdefault(f"{kind}_message", str(e).splitlines()[0][:160])
            try:
                x.add_(1)
            except RuntimeError:
                errors["launch"] += 1
        try:
            torch.cuda.synchronize()
            errors["usable"] = float(x[0].item())  # the context still works: the count of launches that ran
        except RuntimeError as e:
            errors["usable"] = str(e)[:120]
        print(json.dumps(errors), flush=True)


class Child:
    def __init__(self, mode: str, library: Path, control: Path):
        env = ctl.environment(library, control, dict(os.environ))
        if mode == "torch":
            env["PYTORCH_NO_CUDA_MEMORY_CACHING"] = "1"  # every torch.empty is a cudaMalloc
        self.p = subprocess.Popen([sys.executable, __file__, "--child", mode], stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, text=True, env=env)
        line = self.p.stdout.readline().strip()
        if line != "ready":
            raise RuntimeError(f"{mode} child did not start ({line!r}, exit {self.p.wait()})")

    def calls(self, n: int) -> dict:
        self.p.stdin.write(f"{n}\n")
        self.p.stdin.flush()
        return json.loads(self.p.stdout.readline())

    def close(self) -> None:
        self.p.stdin.close()
        self.p.wait(timeout=60)


def main() -> int:
    try:
        ctypes.CDLL(os.environ.get("CHAOSKIT_LIBCUDA", "libcuda.so.1"))
    except OSError as e:
        print(f"no GPU here: no libcuda: {e} (no NVIDIA driver?)")
        print("RESULT ctypes_alloc=nan ctypes_launch=nan procaddr_alloc=nan procaddr_launch=nan after_revert=nan "
              "goal_met=False")
        return 1
    library = ctl.build()
    result: dict[str, float] = {"after_revert": 0}
    modes = ["ctypes", "procaddr"]
    try:
        import torch  # noqa: F401

        modes += ["torch", "torch-cached"]
    except ImportError:
        print("no PyTorch here: torch_alloc not measured")
    with tempfile.TemporaryDirectory() as tmp:
        for mode in modes:
            control, key = Path(tmp) / f"{mode}.ctl", mode.replace("-", "_")
            ctl.create(control)
            child = Child(mode, library, control)
            try:
                with ctl.Control(control) as c:
                    before = child.calls(200)
                    # torch: LAUNCH_OUT_OF_RESOURCES (701), an error the runtime does not treat as fatal to the context
                    c.arm({"alloc": ctl.Rule(ASKED["alloc"], 2),
                           "launch": ctl.Rule(ASKED["launch"], 701 if mode.startswith("torch") else 719)})
                    armed = child.calls(N)
                    c.disarm()
                    after = child.calls(N)
                    print(mode, "before", before, "armed", armed, "after", after, "counts", c.counts())
                    result[f"{key}_alloc"] = armed["alloc"] / N
                    result[f"{key}_launch"] = armed["launch"] / N
                    if not mode.startswith("torch"):
                        c.arm({"sync": ctl.Rule(0, 0, 0.002)})
                        delayed = child.calls(200)
                        c.disarm()
                        plain = child.calls(200)
                        result[f"{key}_sync_delay_ms"] = delayed["sync_ms"] - plain["sync_ms"]
                    result["after_revert"] += sum(v for k, v in after.items() if isinstance(v, int))
            finally:
                child.close()
    errors = {f"{k}_error": abs(v - ASKED[k.rpartition("_")[2]]) for k, v in result.items()
              if k.endswith(("_alloc", "_launch")) and not k.startswith("torch_cached")}
    return GOALS.result({k: f"{v:.4g}" for k, v in result.items()}, **errors)


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--child":
        if sys.argv[2].startswith("torch"):
            _torch_child(sys.argv[2] == "torch-cached")
        else:
            _driver_child(sys.argv[2])
    else:
        sys.exit(main())
