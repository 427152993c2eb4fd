"""host.memory_pressure on the real kernel: pages resident at `ready` (each populate method), revert leaves no
holder, SIGTERM in the middle of a populate, chunks grown and given back, and a `target_used` hold that stays
within 2% of MemTotal while a child of the test allocates and frees 384 MiB. Everything stays under ~1.2 GiB."""

from __future__ import annotations

import json
import os
import select
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

import pytest

from chaoskit.errors import PreflightError
from chaoskit.injectors.memory import holder as memory_holder
from chaoskit.injectors.memory.pressure import MemoryPressure, MemoryPressureSpec, deadband_bytes
from chaoskit.targets.process import find_by_token
from tests.conftest import wait_for

MiB = 1 << 20
# Allocates 384 MiB, holds it, frees it, twice; prints `-` before each change and what it holds after it. (Much
# more than 384 MiB and the instant free alone is over 2% of this box's 24 GiB before the holder regrows.)
CHURN = """
import mmap, sys, time
for _ in range(2):
    print("-", flush=True)
    m = mmap.mmap(-1, 384 << 20)
    m.madvise(23, 0, 384 << 20)
    print(384, flush=True)
    time.sleep(1.0)
    print("-", flush=True)
    m.close()
    print(0, flush=True)
    time.sleep(1.0)
"""


def rss_bytes(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def injector(**kw) -> MemoryPressure:
    inj = MemoryPressure(MemoryPressureSpec(type="host.memory_pressure", **kw))
    inj.ctx.lifetime_s = 60  # a holder a failed test leaves behind exits by itself
    return inj


def holder(nbytes: int, env: dict[str, str] | None = None, config: dict | None = None) -> subprocess.Popen:
    args = [sys.executable, "-P", memory_holder.__file__, "chaoskit-holder-test", str(nbytes), f"{time.time() + 30:.3f}"]
    return subprocess.Popen(args + ([json.dumps(config)] if config else []), stdout=subprocess.PIPE, text=True,
                            env={**os.environ, **(env or {})})


def finish(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.kill()
    proc.wait()


def test_size_is_resident_at_ready_and_revert_leaves_no_holder(state_dir):
    inj = injector(size="256MiB")
    inj.preflight()
    record = inj.prepare()
    final = inj.apply(record)
    try:
        pid = final.holder.pid
        assert rss_bytes(pid) >= 256 * MiB, "pages not resident at ready"
        details = MemoryPressure.observe_details(final)
        assert details["in_effect"] and details["held"] == 256 * MiB
        assert details["holder"]["method"] == "populate_write" and details["holder"]["state"] == "holding"
    finally:
        MemoryPressure.revert(final)
    assert not find_by_token(record.token) and not MemoryPressure.observe(final)
    assert not Path(record.status).exists()
    MemoryPressure.revert(final)  # idempotent
    MemoryPressure.revert(record)  # from the pre-apply record alone, too
    assert MemoryPressure.observe_details(final) == {"in_effect": False, "holder": None}


@pytest.mark.parametrize("method", ["map_populate", "touch"])
def test_fallback_methods_populate_too(method, tmp_path):
    status = tmp_path / "st.json"
    proc = holder(100 * MiB, {"CHAOSKIT_MEMORY_POPULATE": method}, {"status": str(status)})  # 64 MiB + 36 MiB
    try:
        assert proc.stdout.readline().strip() == "ready"
        assert rss_bytes(proc.pid) >= 100 * MiB
        st = json.loads(status.read_text())
        assert (st["method"], st["held"]) == (method, 100 * MiB)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=5) == 0
    finally:
        finish(proc)


def test_pages_grow_and_give_back_newest_first():
    pages = memory_holder.Pages("populate_write", lambda: False)
    try:
        assert pages.grow(100 * MiB) == 100 * MiB and [c.resident for c in pages.chunks] == [64 * MiB, 36 * MiB]
        assert pages.shrink(50 * MiB) == 50 * MiB and [c.resident for c in pages.chunks] == [50 * MiB]
        assert pages.grow(30 * MiB) == 30 * MiB and [c.resident for c in pages.chunks] == [64 * MiB, 16 * MiB]
        rss = rss_bytes(os.getpid())
        assert pages.shrink(10 * MiB + 1) == 10 * MiB + 4096  # page-rounded
        assert rss - rss_bytes(os.getpid()) >= 9 * MiB  # MADV_DONTNEED really gave it back
    finally:
        pages.release()
    assert pages.held == 0 and not pages.chunks


def test_available_memory_counts_the_pages_a_process_just_gave_back():
    """MemAvailable leaves out the free pages on the kernel's per-CPU lists, which since Linux 6.7 grow while a CPU
    frees (measured here: 512 MiB given back with MADV_DONTNEED, MemAvailable unchanged, the lists +509 MiB,
    drained over seconds). A hold judged by MemAvailable alone then gives back far more than another process took
    (seen in CI: 843 MiB for a child's 384). Available memory counts them: it rises by what the RSS fell."""
    pages = memory_holder.Pages("populate_write", lambda: False)
    try:
        pages.grow(512 * MiB)
        rss, (_, before) = rss_bytes(os.getpid()), memory_holder.meminfo()
        pages.release()
        _, after = memory_holder.meminfo()
        freed = rss - rss_bytes(os.getpid())
        assert freed >= 500 * MiB, f"the RSS fell by {freed // MiB} MiB only"
        assert after - before >= freed - 64 * MiB, (
            f"available memory rose by {(after - before) // MiB} MiB for {freed // MiB} MiB given back "
            f"(per-CPU lists now {memory_holder.percpu_free() // MiB} MiB)")
    finally:
        pages.release()


@pytest.mark.parametrize("bound", ["cap", "floor"])
def test_a_hold_stops_growing_at_its_cap_and_at_the_floor(bound, tmp_path):
    _, avail = memory_holder.meminfo()
    # goal far below: the holder wants 1 GiB; the cap (64 MiB) or the floor (128 MiB below now) stops it first
    cap, floor = (64 * MiB, avail - 512 * MiB) if bound == "cap" else (1 << 30, avail - 128 * MiB)
    status = tmp_path / "st.json"
    proc = holder(cap, config={"status": str(status), "goal_available": avail - (1 << 30), "floor": floor,
                               "deadband": 4 * MiB})
    try:
        assert proc.stdout.readline().strip() == "ready"
        st = json.loads(status.read_text())
        assert st["mode"] == "hold" and st["last_corrections"][-1]["bound"] == bound
        if bound == "cap":
            assert st["held"] == 64 * MiB
        else:  # bounded by available memory, which others move too
            assert 0 < st["held"] < cap and st["last_corrections"][-1]["after"] >= floor - 64 * MiB, st
    finally:
        finish(proc)


def test_sigterm_during_a_populate_stops_within_a_second():
    proc = holder(1 << 30, {"CHAOSKIT_MEMORY_POPULATE": "touch"})  # the slowest method: the most time to hit
    try:
        wait_for(lambda: rss_bytes(proc.pid) >= 128 * MiB or proc.poll() is not None, timeout=10, every=0.002)
        at_signal = rss_bytes(proc.pid)
        assert proc.poll() is None and at_signal < 1 << 30, "populated before the test could signal it"
        t0 = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        peak = at_signal
        while proc.poll() is None and time.monotonic() - t0 < 5:
            peak = max(peak, rss_bytes(proc.pid))
            time.sleep(0.002)
        took = time.monotonic() - t0
        assert proc.wait(timeout=1) == 0 and took < 1.0, f"stopped after {took:.2f}s"
        assert peak <= at_signal + 2 * memory_holder.CHUNK, "kept populating after SIGTERM"
        assert proc.stdout.read() == "", "said ready although it was stopped"
    finally:
        finish(proc)


def test_target_used_holds_within_two_percent_while_a_child_allocates_and_frees(state_dir):
    total, avail = memory_holder.meminfo()
    if deadband_bytes(total) > 128 * MiB:
        pytest.skip(f"the hold's deadband (0.25% of MemTotal) is {deadband_bytes(total) // MiB} MiB here: a 384 MiB "
                    "churn cannot tell a holder that reacts from one that does not")
    target = (total - avail + 768 * MiB) / total  # the holder holds ~768 MiB, gives back 384
    inj = injector(target_used=f"{target * 100:.4f}%")
    inj.preflight()
    final = inj.apply(inj.prepare())
    churn = None
    try:
        churn = subprocess.Popen([sys.executable, "-c", CHURN], stdout=subprocess.PIPE, text=True)
        # (seconds since the child's last line, MiB the child holds, error in MiB, MiB the holder holds by its own
        # count, MiB resident in the holder by /proc, MiB used by everything but the holder: MemTotal - available)
        samples: list[tuple[float, int, float, float, int, int]] = []
        child, changed = 0, time.monotonic()
        holder_pid = final.holder.pid
        while churn.poll() is None:
            if select.select([churn.stdout], [], [], 0.1)[0]:
                if line := churn.stdout.readline().strip():  # `-`: about to change; a number: done
                    child, changed = int(line) if line != "-" else child, time.monotonic()
            used = total - memory_holder.meminfo()[1]
            resident = rss_bytes(holder_pid)
            held = MemoryPressure.observe_details(final)["held"]
            samples.append((round(time.monotonic() - changed, 2), child, round((used / total - target) * total / MiB),
                            held // MiB, resident // MiB, (used - resident) // MiB))
        assert churn.returncode == 0
        details = MemoryPressure.observe_details(final)
        worst = max(abs(s[2]) for s in samples) * MiB / total
        assert worst <= 0.02, f"max |error| {worst:.2%} of MemTotal; (since, child, error, held) {samples}"
        # Half a second after each change of the child the holder has made up for it: a holder that did not
        # react would be 384 MiB off while the child holds (others freeing as much at once need no give-back).
        # Over the goal with nothing held, the holder has given back all it can: the others took more than it had
        # (seen in a clean-clone run: memory used besides the holder went from 983 to 2244 MiB, the holder to 0).
        settled = [s for s in samples if s[0] >= 0.5]
        off = [s for s in settled if abs(s[2]) > 192 and not (s[2] > 0 and s[3] == 0)]
        assert settled and not off, f"off the goal by > 192 MiB after settling: {off}; all {samples}"
        # Whether the host's available memory followed the child is measured here, not taken from the holder's own
        # count of its corrections: the memory used by everything but the holder (MemTotal - available memory, less
        # the holder's RSS), sample by sample. A settled sample while the child holds 384 MiB followed it where that is >= 192
        # MiB above its median while the child holds none. Where none did (seen in CI: a VM whose other memory moved
        # with the child's, in one of the two cycles or both) the holder had nothing to correct: a skip.
        base = [s[5] for s in settled if s[1] == 0]
        assert base and any(s[1] == 384 for s in settled), f"no settled sample while the child held 0 and 384 MiB: {samples}"
        others0 = statistics.median(base)
        followed = [s for s in settled if s[1] == 384 and s[5] - others0 >= 192]
        if not followed:
            pytest.skip(f"available memory did not follow the child's 384 MiB (memory used besides the holder: median "
                        f"{others0:.0f} MiB with the child at 0, less than 192 MiB more in every settled sample at 384), "
                        f"so the holder had nothing to correct: (since, child, error, held, holder RSS, others) {samples}")
        # Where it followed, the holder gave back about what the child took (its RSS by /proc, and by its own count).
        rss0, rss384 = statistics.median(s[4] for s in settled if s[1] == 0), statistics.median(s[4] for s in followed)
        print(f"\nchild at 0 / 384 MiB: used besides the holder {others0:.0f} / "
              f"{statistics.median(s[5] for s in followed):.0f} MiB, the holder's RSS {rss0:.0f} / {rss384:.0f} MiB "
              f"(medians of the settled samples; at 384 those {len(followed)} where available memory followed the child)")
        assert rss0 - rss384 >= 192, f"the holder's RSS did not make room for the child: {rss0} / {rss384}; {samples}"
        assert details["corrections"] >= 2 and details["holder"]["last_corrections"], details
    finally:
        if churn is not None:
            finish(churn)
        MemoryPressure.revert(final)
    assert not MemoryPressure.observe(final)


def test_an_impossible_target_is_refused_before_anything_starts(state_dir):
    with pytest.raises(PreflightError, match="nothing to hold: used memory is already"):
        injector(target_used="0.01%").preflight()
    with pytest.raises(PreflightError, match="below the floor"):
        injector(target_used="99.9%", allow_unsafe=True).preflight()
