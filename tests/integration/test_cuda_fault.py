"""gpu.cuda_fault: the interposer (chaoskit/gpu/cuda_fault.c) in a real process, started with `chaoskit cuda-wrap`.

This machine has no GPU: the process calls the simulated CUDA driver (tests/helpers/fake_libcuda.c, a TEST DOUBLE)
through ctypes, both ways a program reaches the driver (symbol lookup, and cuGetProcAddress as the CUDA runtime
does). The interposer, its control file, the injector and the run are real. bench/gpu_check.py runs the same
against the real driver, PyTorch included, on a machine with a GPU.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import struct
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import psutil
import pytest

from chaoskit.errors import PreflightError
from chaoskit.gpu import cuda_fault_ctl as ctl
from chaoskit.injectors.base import FaultContext
from chaoskit.injectors.gpu.cuda_fault import CudaFault, CudaFaultSpec
from tests.conftest import ROOT, chaoskit, ledger_ops, ledgers, wait_for
from tests.helpers.cuda_workload import Driver

ARMED = "from chaoskit.gpu.cuda_fault_ctl import Control; print(int(Control(__import__('pathlib').Path('{}')).armed))"
WORKLOAD = str(ROOT / "tests" / "helpers" / "cuda_workload.py")


def start_workload(control: Path, way: str, state: Path) -> Driver:
    """The workload process, started by `chaoskit cuda-wrap` with its control file."""
    return Driver(subprocess.Popen(
        [sys.executable, "-m", "chaoskit", "cuda-wrap", "--control", str(control), "--", sys.executable,
         WORKLOAD, way], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=ROOT,
        env={**os.environ, "CHAOSKIT_STATE_DIR": str(state)}))


@pytest.fixture
def control(tmp_path: Path) -> Path:
    return tmp_path / "svc.ctl"


def _fault(pid: int, **rules: object) -> CudaFault:
    return CudaFault(CudaFaultSpec.model_validate({"type": "gpu.cuda_fault", "pid": pid, **rules}))


@pytest.mark.parametrize("way", ["dlsym", "procaddress"])
def test_failures_at_the_asked_share_and_none_after_revert(tmp_path, state_dir, fake_cuda, control, way):
    w = start_workload(control, way, state_dir)
    try:
        assert w.calls(200) == {"alloc": {}, "launch": {}, "sync": {}}  # loaded, disarmed: every call goes through
        f = _fault(w.proc.pid, alloc={"share": 0.2}, launch={"share": 0.05, "error": "cuda_error_ecc_uncorrectable"})
        f.preflight()
        assert f.plan() == [f"arm {control} (PIDs {w.proc.pid}): alloc: 0.2 of calls fail with "
                            "CUDA_ERROR_OUT_OF_MEMORY; launch: 0.05 of calls fail with CUDA_ERROR_ECC_UNCORRECTABLE; "
                            "revert: disarm (calls go through; the arming also expires by itself after 3600s)"]
        record = f.apply(f.prepare())
        assert CudaFault.observe(record)
        seen = w.calls(2000)
        details = CudaFault.observe_details(CudaFault.from_ledger(json.loads(json.dumps(record.to_json()))))
        CudaFault.revert(record)
        after = w.calls(1000)
        CudaFault.revert(record)  # idempotent
    finally:
        w.stop()
    assert set(seen["alloc"]) == {"2"} and abs(seen["alloc"]["2"] / 2000 - 0.2) <= 0.03, seen
    assert set(seen["launch"]) == {"214"} and abs(seen["launch"]["214"] / 2000 - 0.05) <= 0.03, seen
    assert seen["sync"] == {}
    assert details["alloc_calls"] == 2000 and details["alloc_failed"] == seen["alloc"]["2"]
    assert details["launch_failed"] == seen["launch"]["214"] and details["sync_failed"] == 0
    assert after == {"alloc": {}, "launch": {}, "sync": {}} and not CudaFault.observe(record)


def test_a_delay_stalls_each_call_and_an_armed_control_is_refused(tmp_path, state_dir, fake_cuda, control):
    w = start_workload(control, "procaddress", state_dir)
    try:
        f = _fault(w.proc.pid, sync={"delay": "2ms"})
        record = f.apply(f.prepare())
        with pytest.raises(PreflightError, match="already armed"):
            _fault(w.proc.pid, alloc={"share": 1}).preflight()
        t = time.monotonic()
        seen = w.calls(100)
        took = time.monotonic() - t
        CudaFault.revert(record)
        t = time.monotonic()
        w.calls(100)
        took_after = time.monotonic() - t
    finally:
        w.stop()
    assert seen == {"alloc": {}, "launch": {}, "sync": {}}
    assert took >= 0.2 > took_after  # 100 synchronisations, 2 ms each


def test_an_arming_nobody_reverts_expires_by_itself_at_the_faults_lifetime(tmp_path, state_dir, fake_cuda, control):
    """The run and its watchdog both died (nothing reverts): every call fails until the lifetime the run gave the
    fault, then every call goes through, though the file still says armed (the interposer never writes the switch)."""
    w = start_workload(control, "procaddress", state_dir)
    try:
        f = CudaFault(CudaFaultSpec.model_validate({"type": "gpu.cuda_fault", "pid": w.proc.pid, "alloc": {"share": 1}}),
                      FaultContext(lifetime_s=2.0))
        record, t0 = f.prepare(), time.time()
        f.apply(record)
        with ctl.Control(control) as c:
            expires = c.expires_at
        assert t0 + 2 <= expires <= math.ceil(time.time() + 2)  # the lifetime, rounded up to the second
        during = w.calls(50)
        time.sleep(max(0.0, expires - time.time()) + 0.05)
        after = w.calls(50)
        switch = struct.unpack_from("<I", control.read_bytes(), 8)[0]  # the header's armed word
        with ctl.Control(control) as c:
            armed = c.armed
    finally:
        w.stop()
    assert during["alloc"] == {"2": 50} and after == {"alloc": {}, "launch": {}, "sync": {}}
    assert switch == 1 and not armed  # left as written, read as expired


def test_cuda_wrap_sweeps_the_control_files_of_ended_commands(state_dir):
    """A wrapped command execs, so its control file stays when it ends; the next wrap removes the files of wraps
    whose commands (and their children: they inherit its lock) are gone and that are over a minute old; a
    --print-env file (a service started elsewhere) is never swept."""
    directory = state_dir / "cuda-fault"
    directory.mkdir(parents=True)
    ended, young, service = (directory / n for n in ("wrap-sleep-0001.ctl", "wrap-sleep-0003.ctl",
                                                     "service-0004.ctl"))
    for f in (ended, young, service):
        ctl.create(f)
    running = start_wrapped(state_dir)  # a real wrap: its file is held by the sleep it execs
    try:
        files = sorted(directory.glob("wrap-sleep-*.ctl"))
        (held,) = [f for f in files if f not in (ended, young)]
        for f in (ended, held, service):
            os.utime(f, (time.time() - 120, time.time() - 120))
        out, err = chaoskit("cuda-wrap", "--print-env", state=state_dir).communicate(timeout=60)
    finally:
        running.kill()
        running.wait()
    new = Path(next(line for line in out.splitlines() if line.startswith(ctl.ENV)).split("=", 1)[1])
    assert sorted(directory.iterdir()) == sorted([held, young, service, new]), (out, err)
    assert new.name.startswith("service-")


def start_wrapped(state: Path) -> subprocess.Popen:
    """`chaoskit cuda-wrap -- sleep 60`, once its command runs (the control file it made is locked)."""
    p = subprocess.Popen([sys.executable, "-m", "chaoskit", "cuda-wrap", "--", "sleep", "60"], cwd=ROOT,
                         env={**os.environ, "CHAOSKIT_STATE_DIR": str(state)})
    wait_for(lambda: psutil.Process(p.pid).name() == "sleep", timeout=30)
    return p


def test_a_process_started_without_the_interposer_is_refused(fake_cuda):
    p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        with pytest.raises(PreflightError, match=f"PID {p.pid} .* was not started with the CUDA interposer; start "
                                                 "it with `chaoskit cuda-wrap -- CMD`"):
            _fault(p.pid, alloc={"share": 0.5}).preflight()
    finally:
        p.kill()
        p.wait()


def test_spec_errors_name_the_field(tmp_path, state_dir):
    exp = tmp_path / "bad.yaml"
    exp.write_text(textwrap.dedent("""\
        apiVersion: chaoskit/v1
        kind: Experiment
        metadata: {name: cuda}
        method:
          - inject: {type: gpu.cuda_fault, pid: 1234, alloc: {share: 0.5, error: CUDA_ERROR_NOPE}}
            duration: 1s
        """))
    run = chaoskit("validate", str(exp), state=state_dir)
    out, err = run.communicate(timeout=30)
    assert run.returncode == 2, out + err
    assert "bad.yaml:5" in out + err and "alloc.error" in out + err and "unknown CUDA error 'CUDA_ERROR_NOPE'" in out + err


def test_a_run_arms_it_for_its_duration_and_reverts(tmp_path, state_dir, fake_cuda, control):
    w = start_workload(control, "dlsym", state_dir)
    exp = tmp_path / "cuda.yaml"
    exp.write_text(textwrap.dedent("""\
        apiVersion: chaoskit/v1
        kind: Experiment
        metadata: {name: cuda-alloc-failures}
        steadyState:
          probes:
            - name: armed
              type: command
              argv: ["%s", "-c", "%s"]
              phases: [during]
              expect: {stdout_number: "1"}
          during: {every: 500ms}
        method:
          - inject: {type: gpu.cuda_fault, pid: "{var.pid}", alloc: {share: 0.5}}
            duration: 1500ms
        """) % (sys.executable, ARMED.format(control)))
    batches: list[tuple[float, int]] = []
    done = threading.Event()

    def drive() -> None:
        while not done.is_set():
            batches.append((time.monotonic(), w.calls(50)["alloc"].get("2", 0)))
            time.sleep(0.02)

    driver = threading.Thread(target=drive)
    driver.start()
    try:
        run = chaoskit("run", str(exp), "--var", f"pid={w.proc.pid}", "--out", str(tmp_path / "o"), state=state_dir)
        out, err = run.communicate(timeout=60)
        ended = time.monotonic()
        time.sleep(0.3)
    finally:
        done.set()
        driver.join()
        w.stop()
    assert run.returncode == 0, out + err
    assert sum(n for _, n in batches) > 0 and all(n == 0 for t, n in batches if t > ended)
    fault = json.loads((tmp_path / "o" / "summary.json").read_text())["faults"][0]
    seen = fault["observed_before_revert"]
    assert seen["alloc_calls"] > 0 and 0.3 < seen["alloc_failed"] / seen["alloc_calls"] < 0.7, seen
    with ctl.Control(control) as c:
        assert not c.armed
    assert all(ledger_ops(p)[-1] == "closed" for p in ledgers(state_dir))


SHIM = """#define _GNU_SOURCE
#include <dlfcn.h>
#include <unistd.h>
pid_t getppid(void) {  /* a typical LD_PRELOAD wrapper: the real function is whatever follows it */
    static pid_t (*real)(void);
    if (!real) real = (pid_t (*)(void))dlsym(RTLD_NEXT, "getppid");
    return real();
}
"""


def test_a_preload_after_it_that_wraps_with_rtld_next_still_finds_libc(tmp_path):
    """dlsym is wrapped: a name that is not a CUDA call must reach glibc as if called from the caller, or a
    shim preloaded after the interposer gets itself back from dlsym(RTLD_NEXT) and recurses to a crash."""
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler to build the test's shim")
    (tmp_path / "shim.c").write_text(SHIM)
    shim = tmp_path / "libshim.so"
    subprocess.run([cc, "-shared", "-fPIC", "-O2", "-o", str(shim), str(tmp_path / "shim.c"), "-ldl"], check=True)
    env = {**os.environ, "LD_PRELOAD": f"{ctl.build()} {shim}"}
    r = subprocess.run([sys.executable, "-c", "import os; print(os.getppid())"], env=env, capture_output=True,
                       text=True, timeout=30)
    assert r.returncode == 0 and r.stdout.strip() == str(os.getpid()), (r.returncode, r.stderr[-500:])
