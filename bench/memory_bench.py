"""host.memory_pressure benchmark: how fast the holder makes N bytes resident, and how closely a `target_used` hold
keeps the host's used memory on target while another process allocates and frees.

Anchor (same run, trials interleaved with the holder's): a C program compiled here with the system `cc -O2`
that malloc()s and memset()s N bytes and reports the seconds of those two calls (its process start excluded).
The holder's time is the injector's whole apply(): interpreter start, kernel population, the `ready` line and
the /proc scan that finds the holder again, i.e. what an experiment waits for. Sizes 1 GiB and 4 GiB (those
that fit in half of MemAvailable), 3 trials each, after one untimed warm-up memset of the largest size (on a VM
the first touch of guest memory the host has not backed yet costs several times more).

Hold accuracy: `target_used` = used now + 10% of MemTotal; once the holder is ready a churn process allocates
(populates) CHURN_STEP at a time up to CHURN_MAX every CHURN_EVERY_S, then frees it step by step, for CHURN_S;
used share sampled every 100 ms; error = (used - target) / MemTotal.

RESULT keys: apply_s_per_gib (best holder apply / GiB at the largest size), vs_memset_ratio (best holder apply /
best memset at that size; goal <= 1.5), hold_error (max |error| over the churn, fraction of MemTotal; goal
<= 0.02), hold_error_p95, churn_step_share (one churn step as a fraction of MemTotal).
"""

from __future__ import annotations

import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

GiB, MiB = 1 << 30, 1 << 20
TRIALS = int(os.environ.get("BENCH_TRIALS", "3"))
CHURN_STEP, CHURN_MAX, CHURN_EVERY_S, CHURN_S = 256 * MiB, 1536 * MiB, 0.4, 15.0
SAMPLE_S = 0.1

MEMSET_C = r"""
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
int main(int argc, char **argv) {
    size_t n = strtoull(argv[1], 0, 10);
    struct timespec a, b;
    clock_gettime(CLOCK_MONOTONIC, &a);
    volatile char *p = malloc(n);
    if (!p) return 1;
    memset((char *)p, 1, n);
    clock_gettime(CLOCK_MONOTONIC, &b);
    printf("%.6f %d\n", (b.tv_sec - a.tv_sec) + (b.tv_nsec - a.tv_nsec) / 1e9, p[n - 1]);
    free((char *)p);
    return 0;
}
"""

CHURN_PY = r"""
import mmap, sys, time
step, top, every, dur = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4])
held, up, end = [], True, time.monotonic() + dur
while time.monotonic() < end:
    if up:
        m = mmap.mmap(-1, step)
        try:
            m.madvise(23, 0, step)  # MADV_POPULATE_WRITE
        except OSError:
            for off in range(0, step, mmap.PAGESIZE):
                m[off] = 1
        held.append(m)
        up = len(held) * step < top
    else:
        held.pop().close()
        up = not held
    print(len(held) * step, flush=True)
    time.sleep(every)
"""


def meminfo() -> tuple[int, int]:
    vals = {}
    for line in Path("/proc/meminfo").read_text().splitlines():
        k, _, rest = line.partition(":")
        if k in ("MemTotal", "MemAvailable"):
            vals[k] = int(rest.split()[0]) * 1024
    return vals["MemTotal"], vals["MemAvailable"]


def memset_s(exe: Path, n: int) -> float:
    out = subprocess.run([str(exe), str(n)], capture_output=True, text=True, check=True, timeout=120)
    return float(out.stdout.split()[0])


def holder_s(n: int) -> tuple[float, float]:
    """(apply seconds, the holder's own populate seconds) for a fixed size; reverted before returning."""
    from chaoskit.injectors.memory.pressure import MemoryPressure, MemoryPressureSpec

    inj = MemoryPressure(MemoryPressureSpec(type="host.memory_pressure", size=n))
    inj.ctx.lifetime_s = 300
    record = inj.prepare()
    t0 = time.perf_counter()
    final = None
    try:
        final = inj.apply(record)
        took = time.perf_counter() - t0
        st = MemoryPressure.observe_details(final)["holder"] or {}
        return took, float(st.get("populate_s", "nan"))
    finally:
        MemoryPressure.revert(final or record)


def spread(xs: list[float]) -> float:
    return (max(xs) - min(xs)) / min(xs)


def bench_apply(exe: Path, sizes: list[int]) -> tuple[float, float]:
    warm = memset_s(exe, sizes[-1])
    print(f"warm-up memset {sizes[-1] / GiB:g} GiB (untimed for the result): {warm:.3f} s")
    print(f"{'size':>6} {'trial':>5} {'memset_s':>9} {'holder_apply_s':>15} {'holder_populate_s':>18}")
    best = {}
    for n in sizes:
        ms, hs = [], []
        for i in range(TRIALS):
            ms.append(memset_s(exe, n))
            h, pop = holder_s(n)
            hs.append(h)
            print(f"{n / GiB:>4g}G {i + 1:>5} {ms[-1]:>9.3f} {h:>15.3f} {pop:>18.3f}")
        best[n] = (min(ms), min(hs))
        print(f"{n / GiB:>4g}G  best {min(ms):>9.3f} {min(hs):>15.3f}   spread memset {spread(ms):.0%} "
              f"holder {spread(hs):.0%}   ratio {min(hs) / min(ms):.3f}   holder {min(hs) / (n / GiB):.3f} s/GiB")
    n = sizes[-1]
    return best[n][1] / (n / GiB), best[n][1] / best[n][0]


def bench_hold() -> tuple[float, float, float]:
    from chaoskit.injectors.memory.pressure import MemoryPressure, MemoryPressureSpec

    total, avail = meminfo()
    target = (total - avail) / total + 0.10
    inj = MemoryPressure(MemoryPressureSpec(type="host.memory_pressure", target_used=f"{target * 100:.4f}%"))
    inj.ctx.lifetime_s = 120
    print("\nhold: " + " | ".join(inj.plan()[:2]))
    inj.preflight()
    record, final, churn = inj.prepare(), None, None
    try:
        t0 = time.perf_counter()
        final = inj.apply(record)
        print(f"hold ready in {time.perf_counter() - t0:.3f} s; target used {target:.2%} of "
              f"{total / GiB:.1f} GiB; churn {CHURN_STEP // MiB} MiB steps up to {CHURN_MAX // MiB} MiB "
              f"every {CHURN_EVERY_S} s for {CHURN_S:g} s")
        churn = subprocess.Popen([sys.executable, "-c", CHURN_PY, str(CHURN_STEP), str(CHURN_MAX),
                                  str(CHURN_EVERY_S), str(CHURN_S)], stdout=subprocess.PIPE)
        fd = churn.stdout.fileno()
        os.set_blocking(fd, False)
        errors, churned, t_start = [], 0, time.monotonic()
        print(f"{'t_s':>5} {'used%':>7} {'err%':>7} {'held_MiB':>9} {'churn_MiB':>9}")
        while churn.poll() is None:
            time.sleep(SAMPLE_S)
            try:
                churned = int(os.read(fd, 65536).split()[-1])
            except (BlockingIOError, IndexError):
                pass
            total, avail = meminfo()
            used = (total - avail) / total
            errors.append(used - target)
            held = (MemoryPressure.observe_details(final).get("held") or 0) // MiB
            print(f"{time.monotonic() - t_start:>5.1f} {used:>7.2%} {used - target:>+7.2%} {held:>9} "
                  f"{churned // MiB:>9}")
        details = MemoryPressure.observe_details(final)
        print(f"holder corrections: {details.get('corrections')}")
    finally:
        if churn is not None and churn.poll() is None:
            churn.kill()
        if churn is not None:
            churn.wait()
        MemoryPressure.revert(final or record)
    abs_err = sorted(abs(e) for e in errors)
    p95 = abs_err[int(0.95 * (len(abs_err) - 1))]
    print(f"hold error over {len(errors)} samples: max {abs_err[-1]:.2%}  p95 {p95:.2%}  "
          f"mean {statistics.fmean(abs_err):.2%} of MemTotal")
    return abs_err[-1], p95, CHURN_STEP / total


def main() -> int:
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # run the finally blocks
    tmp = Path(tempfile.mkdtemp(prefix="chaoskit-membench-"))
    os.environ["CHAOSKIT_STATE_DIR"] = str(tmp / "state")
    try:
        exe = tmp / "memset"
        (tmp / "memset.c").write_text(MEMSET_C)
        subprocess.run(["cc", "-O2", "-o", str(exe), str(tmp / "memset.c")], check=True)
        _, avail = meminfo()
        sizes = [n for n in (1 * GiB, 4 * GiB) if n <= avail // 2] or [avail // 4 // MiB * MiB]
        per_gib, ratio = bench_apply(exe, sizes)
        err, p95, step = bench_hold()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"RESULT apply_s_per_gib={per_gib:.3f} vs_memset_ratio={ratio:.3f} hold_error={err:.4f} "
          f"hold_error_p95={p95:.4f} churn_step_share={step:.4f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
