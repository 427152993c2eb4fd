"""The run's side of the proxy forkserver (forkserver/main.py): started before the method when the run has a proxy to
run here (else at its first spawn), closed at the run's end; each proxy helper of the run is forked from it
instead of started as a new Python."""

from __future__ import annotations

import errno
import json
import select
import socket
import subprocess
import threading

from chaoskit.injectors.helper_proc import command, env, started
from chaoskit.targets.process import ProcessRef

MODULE = "chaoskit.injectors.forkserver.main"
TIMEOUT_S = 30.0  # for the forkserver's `ready`, and for each helper's
GONE = {errno.EPIPE, errno.ECONNRESET, errno.ECONNREFUSED, errno.ENOTCONN}  # sending to a forkserver that died


class Forkserver:
    """One per run; thread-safe (the run applies a parallel block's faults from many threads). The helpers it
    forks are what proxy_proc would start (own session, the token in the command line) and outlive it."""

    def __init__(self, timeout_s: float = TIMEOUT_S) -> None:
        self.timeout_s = timeout_s
        self._lock = threading.Lock()
        self._proc: subprocess.Popen | None = None
        self._control: socket.socket | None = None
        self._closed = False

    def spawn(self, token: str, args: list[str], what: str, extra_env: dict[str, str] | None = None) -> ProcessRef:
        """Fork the helper `proxy_proc TOKEN *args` (with `extra_env`), wait for its `ready`."""
        request = json.dumps({"token": token, "args": args, "env": extra_env or {}}).encode()
        mine, theirs = socket.socketpair()
        with mine:
            with theirs:
                self._send(request, theirs)
            mine.settimeout(self.timeout_s)
            try:
                answer = mine.makefile("r").readline().strip()
            except TimeoutError:
                raise RuntimeError(f"{what}: no answer from the proxy forkserver in {self.timeout_s:g}s") from None
        if not answer.startswith("ready "):
            raise RuntimeError(f"{what} failed to start: {answer.removeprefix('error ') or 'it exited'}")
        return started(int(answer.split()[1]), token)

    def _send(self, request: bytes, answer: socket.socket) -> None:
        """Send the request and the answer socket; a forkserver found gone (killed) is started again, once."""
        control = self._started()
        try:
            socket.send_fds(control, [request], [answer.fileno()])
        except OSError as e:
            if e.errno not in GONE and not self._dead():
                raise
            self._stop(control)
            socket.send_fds(self._started(), [request], [answer.fileno()])

    def _dead(self) -> bool:
        with self._lock:
            return self._proc is not None and self._proc.poll() is not None

    def start(self) -> None:
        """Start it now (else the first spawn does), waiting for its `ready`."""
        self._started()

    def prestart(self) -> None:
        """start() on a thread (a failure shows at the first spawn, which tries again)."""
        threading.Thread(target=self._quiet_start, name="chaoskit-forkserver", daemon=True).start()

    def _quiet_start(self) -> None:
        try:
            self.start()
        except (OSError, RuntimeError):
            pass

    def _started(self) -> socket.socket:
        with self._lock:
            if self._closed:
                raise RuntimeError("the run's proxy forkserver is closed")
            if self._control is None:
                self._proc, self._control = self._launch()
            return self._control

    def _launch(self) -> tuple[subprocess.Popen, socket.socket]:
        """Start the forkserver process and wait (up to timeout_s) for its `ready`."""
        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            with theirs:
                proc = subprocess.Popen(command(MODULE), stdin=theirs, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                        text=True, env=env())
        except OSError:
            mine.close()
            raise
        assert proc.stdout is not None
        ready = select.select([proc.stdout], [], [], self.timeout_s)[0] and proc.stdout.readline().strip() == "ready"
        if not ready:
            mine.close()
            proc.kill()
            _, err = proc.communicate()
            raise RuntimeError(f"the proxy forkserver failed to start (exit {proc.returncode}): "
                               f"{err.strip()[-500:] or f'no ready in {self.timeout_s:g}s'}")
        return proc, mine

    def close(self) -> None:
        """Stop it (its helpers go on): closing our end is its signal to exit."""
        with self._lock:
            self._closed = True
            control = self._control
        self._stop(control)

    def _stop(self, control: socket.socket | None) -> None:
        """Stop the forkserver behind `control` if it is still ours."""
        with self._lock:
            if control is None or control is not self._control:
                return
            proc, self._proc, self._control = self._proc, None, None
        control.close()
        if proc is None:
            return
        try:
            proc.wait(2)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        for pipe in (proc.stdout, proc.stderr):
            if pipe is not None:
                pipe.close()
