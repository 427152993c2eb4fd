"""gpu.memory_pressure through the real ctypes binding, holder process and engine, on a simulated CUDA driver.

This machine has no GPU: `tests/helpers/fake_libcuda.c` (a test double, named as such) is compiled into a
libcuda.so.1 stand-in whose device memory is shared by every process, so the holder, a neighbour process
and the probes see one device. The no-GPU behaviour (exit 4) is tested against the real, absent driver.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from chaoskit.errors import PreflightError
from tests.conftest import FAKE_GPU_TOTAL, ROOT, chaoskit, device_used, ledger_ops, ledgers, wait_for

GiB = 1 << 30
TOTAL = FAKE_GPU_TOTAL
GPU_EXPERIMENTS = sorted(p.name for p in (ROOT / "experiments" / "gpu").glob("*.yaml") if "xid" not in p.name)


def _real_driver_missing() -> str | None:
    from chaoskit.gpu.cuda import Driver

    env = os.environ.pop("CHAOSKIT_LIBCUDA", None)
    try:
        Driver()
    except PreflightError as e:
        return str(e)
    finally:
        if env is not None:
            os.environ["CHAOSKIT_LIBCUDA"] = env
    return None


NEIGHBOUR = textwrap.dedent("""
    import random, sys, time
    from chaoskit.gpu.cuda import Driver
    d = Driver(); d.open_device(0)
    rng, mine, end = random.Random(3), [], time.time() + float(sys.argv[1])
    print("ready", flush=True)
    while time.time() < end:
        if mine and (rng.random() < 0.5 or len(mine) > 4):
            d.free(mine.pop(rng.randrange(len(mine))))
        else:
            p = d.alloc(rng.randrange(16, 60) << 20)   # bursts of 16-60 MiB (up to 1.5% of the 4 GiB device)
            if p is not None:
                mine.append(p)
        time.sleep(rng.uniform(0.2, 0.5))
""")


def test_binding_against_the_simulated_driver_sees_other_processes(fake_cuda):
    from chaoskit.gpu.cuda import Driver

    drv = Driver()
    facts = drv.facts(0)
    assert facts.uuid == "GPU-00000000-0000-0000-0000-00000000c0de" and facts.total == TOTAL
    drv.open_device(0)
    ptr = drv.alloc(100 << 20)
    assert ptr is not None and drv.info() == (TOTAL - (100 << 20), TOTAL)
    other = subprocess.Popen([sys.executable, "-c", "from chaoskit.gpu.cuda import Driver; d = Driver(); "
                              "d.open_device(0); d.alloc(1 << 30); print('ready', flush=True); input()"],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert other.stdout.readline().strip() == "ready"
    assert drv.info()[0] == TOTAL - (100 << 20) - GiB
    other.kill()
    other.wait()
    assert drv.info()[0] == TOTAL - (100 << 20)  # a dead process's memory is released, as on a real driver
    assert drv.alloc(8 * GiB) is None  # out of memory is None, not an exception
    drv.free(ptr)


SHARE_PROBE = "from chaoskit.gpu.cuda import Driver; d = Driver(); d.open_device(0); f, t = d.info(); print((t - f) / t)"


def _experiment(tmp_path: Path, inject: str, duration: str = "4s", probe_expect: str = "") -> Path:
    path = tmp_path / "gpu.yaml"
    path.write_text(textwrap.dedent(f"""\
        apiVersion: chaoskit/v1
        kind: Experiment
        metadata: {{name: gpu-test}}
        steadyState:
          probes:
            - name: device-used-share
              type: command
              argv: ["{sys.executable}", "-c", "{SHARE_PROBE}"]
              phases: [during]
              expect: {{{probe_expect}}}
          during: {{every: 500ms}}
        method:
          - inject: {inject}
            duration: {duration}
        """))
    return path


def test_steady_hold_end_to_end_with_a_bursting_neighbour(tmp_path, state_dir, fake_cuda):
    neighbour = subprocess.Popen([sys.executable, "-c", NEIGHBOUR, "12"], stdout=subprocess.PIPE, text=True,
                                 cwd=ROOT)
    try:
        assert neighbour.stdout.readline().strip() == "ready"
        exp = _experiment(tmp_path, "{type: gpu.memory_pressure, percent: 50%, hold: steady}", "5s",
                          'stdout_number: "0.48..0.52"')
        run = chaoskit("run", str(exp), "--out", str(tmp_path / "o"), state=state_dir, cwd=ROOT)
        out, err = run.communicate(timeout=60)
        assert run.returncode == 0, out + err
    finally:
        neighbour.kill()
        neighbour.wait()
    s = json.loads((tmp_path / "o" / "summary.json").read_text())
    seen = s["faults"][0]["observed_before_revert"]
    assert seen["in_effect"] and seen["holder"]["state"] == "holding"
    deltas = [c["delta"] for c in seen["corrections"]]
    assert seen["corrections_total"] == len(deltas) and any(d > 0 for d in deltas) and any(d < 0 for d in deltas)
    assert all(abs(c["goal_used"] - TOTAL // 2) <= 1 for c in seen["corrections"])
    samples = [x for x in s["samples"] if x["phase"] == "during"]
    assert len(samples) >= 6 and all(x["verdict"] == "ok" for x in samples)
    assert device_used() == 0  # holder and neighbour gone: the device is empty again
    assert not list((state_dir / "gpu").glob("*")) and not ledgers(state_dir)


def test_fixed_bytes_more_than_free_fails_preflight_and_applies_nothing(tmp_path, state_dir, fake_cuda):
    exp = _experiment(tmp_path, "{type: gpu.memory_pressure, bytes: 6GiB}")
    run = chaoskit("run", str(exp), "--out", str(tmp_path / "o"), state=state_dir)
    out, err = run.communicate(timeout=60)
    assert run.returncode == 4, out + err
    assert "has 4.0GiB free, 6.0GiB requested" in out + err
    assert device_used() == 0


def test_sigkill_of_chaoskit_releases_the_gpu_memory(tmp_path, state_dir, fake_cuda):
    exp = _experiment(tmp_path, "{type: gpu.memory_pressure, bytes: 1GiB}", "60s", 'stdout_number: "> 0"')
    run = chaoskit("run", str(exp), "--out", str(tmp_path / "o"), state=state_dir)
    try:
        wait_for(lambda: device_used() == GiB, timeout=30, every=0.1)
        run.send_signal(signal.SIGKILL)
        run.wait(timeout=10)
        took = wait_for(lambda: device_used() == 0, timeout=10, every=0.05)
    finally:
        run.kill()
        run.communicate()
    assert took < 5
    # the watchdog replayed the ledger too (it keeps it, closed, as evidence) and the holder's files are gone
    wait_for(lambda: all(ledger_ops(p)[-1] == "closed" for p in ledgers(state_dir)), timeout=10)
    assert ledgers(state_dir) and not list((state_dir / "gpu").glob("*"))


REAL_DRIVER_MISSING = _real_driver_missing()


@pytest.mark.skipif(REAL_DRIVER_MISSING is None, reason="this host has a CUDA driver: the no-GPU path does not apply")
@pytest.mark.parametrize("name", GPU_EXPERIMENTS)
@pytest.mark.parametrize("dry", [False, True])
def test_gpu_experiment_without_gpu_fails_preflight_with_exit_4(tmp_path, state_dir, name, dry):
    run = chaoskit("run", f"experiments/gpu/{name}", *(["--dry-run"] if dry else []), "--plain",
                   "--out", str(tmp_path / "o"), state=state_dir)
    out, err = run.communicate(timeout=60)
    assert run.returncode == 4, out + err
    assert "no libcuda" in out + err or "no NVML" in out + err
    if dry:
        assert "plan for" in out and "preflight failed:" in err
    assert not ledgers(state_dir)
