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
used share (MemTotal - available memory: MemAvailable + the per-CPU lists' free pages, as the holder reads it)
sampled every 100 ms until the churn says `end` (it then keeps what it holds); error = (used - target) /
MemTotal. The goal is judged on these samples: each churn step changes used memory by CHURN_STEP (1.06% of a 23.5
GiB MemTotal), which the holder answers at its next 100 ms tick, so a sample right after a step is off by about a
step and no more (max 1.11%, 1.24% and 1.17% in three runs on 2026-12-06; a CHURN_STEP over 2% of MemTotal
could not be held in that sample, see churn_step_share).

Release (not judged): then the churn process is killed holding what it held at its end (up to CHURN_MAX, 6.5% of
MemTotal), so the kernel frees all of it at once, and used memory is sampled every 10 ms for 2 s. Before
2026-12-06 that exit fell inside the sampling window, and its sample was the hold error's maximum (2.77% in a run
that day, 4.6% in issue 47; every churn-step sample of that run was within 1.08%). It cannot be held within 2%.
Two runs on 2026-12-06 (`BENCH_PARTS=hold .venv/bin/python bench/memory_bench.py`, then the whole bench), each
releasing 1280 MiB (5.31% of MemTotal): the kernel freed it in 0.11 and 0.14 s (~11 and ~9 GiB/s), the holder
saw it at its next tick (30-60 ms after) and populated about 750 and 1040 MiB back in 0.22 and 0.29 s (~3.4
and ~3.5 GiB/s); used memory was more than 2% under the target for 0.15 and 0.27 s, 3.19% and 4.31% at worst. At
those rates a holder that started populating the instant the release began would still be 0.88 and 0.77 GiB
(3.7% and 3.3% of MemTotal) short when the release ends: memory freed faster than it can be populated puts any
hold behind by most of a release, whatever its tick.

RESULT keys: apply_s_per_gib (best holder apply / GiB at the largest size), vs_memset_ratio (best holder apply /
best memset at that size; goal <= 1.5), hold_error (max |error| over the churn, fraction of MemTotal; goal
<= 0.02), hold_error_p95, churn_step_share (one churn step as a fraction of MemTotal), release_share (what the
churn held at its end, fraction of MemTotal), release_error (how far used memory fell below the target after the
release, fraction of MemTotal), release_outside_s (the last sample more than 2% off, seconds after the kill),
goal_met, missed= (the goals missed). BENCH_PARTS (default "apply,hold") picks the parts; a part left out leaves
its goal unjudged.

Goals (GOALS below; exit 1 when one is missed; `--goal key=value` sets one for a run, see bench/goals.py): apply
<= 1.5x memset; the host's used memory held within +-2% of MemTotal of the target in every sample of the churn.
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

sys.path.insert(0, str(Path(__file__).resolve().parent))
from goals import Goal, Goals  # noqa: E402

from chaoskit.injectors.memory.holder import meminfo  # noqa: E402  (the used memory a hold holds: MemTotal - available)

GOALS = Goals(Goal("vs_memset_ratio", "<=", 1.5, "holder apply / malloc+memset of the same size"),
              Goal("hold_error", "<=", 0.02, "max |used - target| over the churn, fraction of MemTotal"))
GiB, MiB = 1 << 30, 1 << 20
PARTS = os.environ.get("BENCH_PARTS", "apply,hold").split(",")
TRIALS = int(os.environ.get("BENCH_TRIALS", "3"))
CHURN_STEP, CHURN_MAX, CHURN_EVERY_S, CHURN_S = 256 * MiB, 1536 * MiB, 0.4, 15.0
SAMPLE_S = 0.1
RELEASE_S, RELEASE_SAMPLE_S = 2.0, 0.01

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
print("end", flush=True)  # the churn is over: it keeps what it holds until the bench kills it (the release)
sys.stdin.read()
"""


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


def bench_hold() -> dict[str, str]:
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
                                  str(CHURN_EVERY_S), str(CHURN_S)], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        fd = churn.stdout.fileno()
        os.set_blocking(fd, False)
        errors, churned, ended, t_start = [], 0, False, time.monotonic()
        print(f"{'t_s':>5} {'used%':>7} {'err%':>7} {'held_MiB':>9} {'churn_MiB':>9}")
        while not ended:
            time.sleep(SAMPLE_S)
            try:
                said = os.read(fd, 65536).split()
            except BlockingIOError:
                said = []
            ended = b"end" in said
            churned = next((int(x) for x in reversed(said) if x.isdigit()), churned)
            if churn.poll() is not None and not ended:
                raise RuntimeError(f"the churn process exited {churn.returncode} before its end")
            total, avail = meminfo()
            used = (total - avail) / total
            errors.append(used - target)
            held = (MemoryPressure.observe_details(final).get("held") or 0) // MiB
            print(f"{time.monotonic() - t_start:>5.1f} {used:>7.2%} {used - target:>+7.2%} {held:>9} "
                  f"{churned // MiB:>9}")
        release = release_at_once(churn, churned, target)
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
    return {"hold_error": f"{abs_err[-1]:.4f}", "hold_error_p95": f"{p95:.4f}",
            "churn_step_share": f"{CHURN_STEP / total:.4f}", **release}


def release_at_once(churn: subprocess.Popen, churned: int, target: float) -> dict[str, str]:
    """Kill the churn process while it holds what it held at its end (`churned` bytes), so the kernel frees all of
    it at once (what its exit did inside the sampling window before 2026-12-06), and sample every RELEASE_SAMPLE_S
    for RELEASE_S from the kill: how far used memory falls below the target and how long the holder takes to bring
    it back within +-2%."""
    total, _ = meminfo()
    t0 = time.monotonic()
    churn.kill()  # reaped after: its exit frees the memory over ~0.1-0.2 s, which is what is sampled
    samples: list[tuple[float, float]] = []
    while (t := time.monotonic() - t0) < RELEASE_S:
        total, avail = meminfo()
        samples.append((t, (total - avail) / total - target))
        time.sleep(RELEASE_SAMPLE_S)
    churn.wait()
    worst = min(e for _, e in samples)
    out_s = max((t for t, e in samples if abs(e) > 0.02), default=0.0)  # the last sample outside +-2%
    print(f"release: the churn process killed holding {churned // MiB} MiB ({churned / total:.2%} of MemTotal); used "
          f"fell to {worst:+.2%} of MemTotal off the target and was outside +-2% until {out_s:.3f} s after the kill "
          f"({len(samples)} samples, one every {RELEASE_SAMPLE_S * 1000:g} ms + the read)")
    for t, e in samples[: next((i for i, (t, _) in enumerate(samples) if t > 1.5 * max(out_s, 0.2)), len(samples))]:
        print(f"  {t:6.3f} s {e:+.2%}")
    return {"release_share": f"{churned / total:.4f}", "release_error": f"{-worst:.4f}",
            "release_outside_s": f"{out_s:.3f}"}


def main() -> int:
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # run the finally blocks
    tmp = Path(tempfile.mkdtemp(prefix="chaoskit-membench-"))
    os.environ["CHAOSKIT_STATE_DIR"] = str(tmp / "state")
    try:
        exe = tmp / "memset"
        (tmp / "memset.c").write_text(MEMSET_C)
        subprocess.run(["cc", "-O2", "-o", str(exe), str(tmp / "memset.c")], check=True)
        _, avail = meminfo()
        keys: dict[str, str] = {}
        if "apply" in PARTS:
            sizes = [n for n in (1 * GiB, 4 * GiB) if n <= avail // 2] or [avail // 4 // MiB * MiB]
            per_gib, ratio = bench_apply(exe, sizes)
            keys.update(apply_s_per_gib=f"{per_gib:.3f}", vs_memset_ratio=f"{ratio:.3f}")
        if "hold" in PARTS:
            keys.update(bench_hold())
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return GOALS.result(keys)


if __name__ == "__main__":
    sys.exit(main())
