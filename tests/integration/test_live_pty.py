"""The live view on a pseudo-terminal while faults are reverted at the end of their durations (from revert
threads, as Rich redraws from its own thread): the run must finish with its exact exit code, never hang."""

from __future__ import annotations

import os
import pty
import select
import subprocess
import sys
import time

import pytest

from tests.conftest import ROOT, proc_state

EXPERIMENT = """\
apiVersion: chaoskit/v1
kind: Experiment
metadata: {{name: live-pty}}
steadyState:
  probes:
    - {{name: a, type: command, argv: ["true"]}}
    - {{name: b, type: command, argv: ["true"]}}
  during: {{every: 100ms}}
  after: {{within: 5s, every: 100ms}}
method:
  - inject: {{type: process.signal, pid: {pid}}}
    duration: 700ms
  - parallel:
      - inject: {{type: process.signal, pid: {pid}}}
        duration: 500ms
      - inject: {{type: host.memory_pressure, size: 16MiB}}
        duration: 600ms
  - inject: {{type: host.memory_pressure, size: 16MiB}}
    duration: 300ms
"""


@pytest.mark.parametrize("attempt", range(2))
def test_live_view_on_a_pty_finishes(tmp_path, state_dir, sleeper, attempt):
    (tmp_path / "e.yaml").write_text(EXPERIMENT.format(pid=sleeper.pid))
    master, slave = pty.openpty()
    env = {**os.environ, "CHAOSKIT_STATE_DIR": str(state_dir), "TERM": "xterm-256color", "COLUMNS": "120"}
    run = subprocess.Popen([sys.executable, "-m", "chaoskit", "run", str(tmp_path / "e.yaml"), "--live",
                            "--out", str(tmp_path / "o")], stdin=slave, stdout=slave, stderr=slave, env=env, cwd=ROOT)
    os.close(slave)
    screen = b""
    deadline = time.monotonic() + 60
    try:
        while run.poll() is None and time.monotonic() < deadline:
            ready, _, _ = select.select([master], [], [], 0.1)
            if ready:
                try:
                    screen += os.read(master, 65536)
                except OSError:  # EIO: the run closed the terminal (it is exiting)
                    break
        try:
            run.wait(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            raise AssertionError("the run hung with the live view on a pty") from None
    finally:
        run.kill()
        run.wait()
        os.close(master)
    assert run.returncode == 0, screen.decode(errors="replace")[-3000:]
    assert b"active faults" in screen and b"held" in screen
    assert proc_state(sleeper.pid) in ("S", "R")
