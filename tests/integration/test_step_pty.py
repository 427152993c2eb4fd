"""`chaoskit run --step` driven through a pseudo-terminal, live view on: the plan of each step is shown before
the question; continue applies it, skip leaves it out, abort rolls everything back (exit 3); Ctrl-C at the
question rolls back too (exit 130); without a terminal --step is refused (exit 2)."""

from __future__ import annotations

import fcntl
import json
import os
import pty
import select
import subprocess
import sys
import termios
import time

from tests.conftest import ROOT, chaoskit, proc_state

PROMPT = b"[c]ontinue (Enter)"
EXPERIMENT = """\
apiVersion: chaoskit/v1
kind: Experiment
metadata: {{name: step-pty}}
steadyState:
  probes:
    - {{name: a, type: command, argv: ["true"], expect: {{exit_code: 0}}}}
  during: {{every: 200ms}}
  after: {{within: 5s, every: 100ms}}
method:
  - name: freeze-sleeper
    inject: {{type: process.signal, pid: {pid}}}
  - name: squeeze-memory
    inject: {{type: host.memory_pressure, size: 16MiB}}
    duration: 2s
  - name: freeze-again
    inject: {{type: process.signal, pid: {pid}}}
    duration: 1s
"""


def _own_terminal() -> None:
    """In the child: a session of its own with the pty as controlling terminal, so Ctrl-C typed there is SIGINT."""
    os.setsid()
    fcntl.ioctl(0, termios.TIOCSCTTY, 0)


class Terminal:
    """A chaoskit run on a pty: read what it shows, type answers."""

    def __init__(self, args: list[str], env: dict[str, str]):
        self.master, slave = pty.openpty()
        self.proc = subprocess.Popen([sys.executable, "-m", "chaoskit", *args], stdin=slave, stdout=slave,
                                     stderr=slave, env=env, cwd=ROOT, preexec_fn=_own_terminal)
        os.close(slave)
        self.screen = b""

    def read_until(self, pred, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while not pred(self.screen):
            if time.monotonic() > deadline or self.proc.poll() is not None and not self._pump(0.05):
                raise AssertionError("not seen on the terminal:\n" + self.screen.decode(errors="replace")[-3000:])
            self._pump(0.1)

    def _pump(self, wait: float) -> bool:
        ready, _, _ = select.select([self.master], [], [], wait)
        if not ready:
            return False
        try:
            chunk = os.read(self.master, 65536)
        except OSError:  # EIO: the run closed the terminal
            return False
        self.screen += chunk
        return bool(chunk)

    def type(self, text: bytes) -> None:
        os.write(self.master, text)

    def finish(self, timeout: float = 60) -> int:
        deadline = time.monotonic() + timeout
        try:
            while self.proc.poll() is None and time.monotonic() < deadline:
                self._pump(0.1)
            self._pump(0.05)
            return self.proc.wait(timeout=max(1.0, deadline - time.monotonic()))
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait()
            os.close(self.master)


def _env(state_dir) -> dict[str, str]:
    return {**os.environ, "CHAOSKIT_STATE_DIR": str(state_dir), "TERM": "xterm-256color", "COLUMNS": "160",
            "LINES": "50"}


def test_step_continue_skip_abort(tmp_path, state_dir, sleeper):
    (tmp_path / "e.yaml").write_text(EXPERIMENT.format(pid=sleeper.pid))
    term = Terminal(["run", str(tmp_path / "e.yaml"), "--step", "--live", "--out", str(tmp_path / "o")],
                    _env(state_dir))
    try:
        term.read_until(lambda s: s.count(PROMPT) >= 1)
        before = term.screen
        assert b"next step 1: freeze-sleeper (process.signal until the end of the method)" in before
        assert f"send SIGSTOP to PID {sleeper.pid}".encode() in before  # its plan, before it changes anything
        assert proc_state(sleeper.pid) in ("S", "R")  # nothing applied while asking
        term.type(b"c\n")
        term.read_until(lambda s: s.count(PROMPT) >= 2)
        assert b"next step 2: squeeze-memory (host.memory_pressure for 2s)" in term.screen
        assert b"anonymous memory" in term.screen.split(b"next step 2")[1]
        assert proc_state(sleeper.pid) == "T"  # step 1 was applied
        term.type(b"s\n")
        term.read_until(lambda s: s.count(PROMPT) >= 3)
        assert b"next step 3: freeze-again" in term.screen
        term.type(b"a\n")
    finally:
        code = term.finish()
    assert code == 3, term.screen.decode(errors="replace")[-3000:]
    assert proc_state(sleeper.pid) in ("S", "R")  # abort rolled step 1 back
    events = [json.loads(line) for line in (tmp_path / "o" / "journal.jsonl").read_text().splitlines()]
    assert [(e["step"], e["choice"]) for e in events if e["event"] == "operator"] == [
        ("freeze-sleeper", "continue"), ("squeeze-memory", "skip"), ("freeze-again", "abort")]
    assert [e["type"] for e in events if e["event"] == "fault_applied"] == ["process.signal"]
    summary = json.loads((tmp_path / "o" / "summary.json").read_text())
    assert summary["status"] == "aborted" and summary["rollback_complete"]
    assert summary["reason"] == "aborted by the operator before step freeze-again"
    assert b"aborted" in term.screen and b"active faults" in term.screen


def test_ctrl_c_at_the_question_rolls_back(tmp_path, state_dir, sleeper):
    (tmp_path / "e.yaml").write_text(EXPERIMENT.format(pid=sleeper.pid))
    term = Terminal(["run", str(tmp_path / "e.yaml"), "--step", "--plain", "--out", str(tmp_path / "o")],
                    _env(state_dir))
    try:
        term.read_until(lambda s: s.count(PROMPT) >= 1)
        term.type(b"\n")  # Enter: continue
        term.read_until(lambda s: s.count(PROMPT) >= 2)
        assert proc_state(sleeper.pid) == "T"
        term.type(b"\x03")  # Ctrl-C: the terminal sends SIGINT
    finally:
        code = term.finish()
    assert code == 130, term.screen.decode(errors="replace")[-3000:]
    assert proc_state(sleeper.pid) in ("S", "R")
    assert b"operator step=freeze-sleeper choice=continue" in term.screen


def test_step_needs_a_terminal(tmp_path, state_dir):
    (tmp_path / "e.yaml").write_text(EXPERIMENT.format(pid=os.getpid()))
    run = chaoskit("run", str(tmp_path / "e.yaml"), "--step", state=state_dir, stdin=subprocess.DEVNULL)
    _, err = run.communicate(timeout=30)
    assert run.returncode == 2 and "--step asks before each step: stdin must be a terminal" in err
    run = chaoskit("run", str(tmp_path / "e.yaml"), "--step", "--ci", state=state_dir, stdin=subprocess.DEVNULL)
    _, err = run.communicate(timeout=30)
    assert run.returncode == 2 and "does not go with --dry-run or --ci" in err
