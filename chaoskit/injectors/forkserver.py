"""The run's side of the proxy forkserver (proxy_fork.py): started at the first proxy a run applies, closed at
the run's end; each proxy helper of the run is forked from it instead of started as a new Python."""

from __future__ import annotations

import json
import socket
import subprocess
import threading

from chaoskit.targets.process import ProcessRef, cmdline, proc_ref

MODULE = "chaoskit.injectors.proxy_fork"


class Forkserver:
    """One per run; thread-safe (the run applies a parallel block's faults from many threads). The helpers it
    forks are what proxy_proc would start (own session, the token in the command line) and outlive it."""

    def __init__(self) -> None:
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
            answer = mine.makefile("r").readline().strip()
        if not answer.startswith("ready "):
            raise RuntimeError(f"{what} failed to start: {answer.removeprefix('error ') or 'it exited'}")
        pid = int(answer.split()[1])
        ref = proc_ref(pid) if token in cmdline(pid) else None
        return ref if ref is not None else ProcessRef(pid, 0)

    def _send(self, request: bytes, answer: socket.socket) -> None:
        """Send the request and the answer socket; a forkserver found gone (killed) is started again, once."""
        control = self._started()
        try:
            socket.send_fds(control, [request], [answer.fileno()])
        except OSError:
            self._stop(control)
            socket.send_fds(self._started(), [request], [answer.fileno()])

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
                from chaoskit.injectors.helper_proc import command, env

                mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
                with theirs:
                    proc = subprocess.Popen(command(MODULE), stdin=theirs, stdout=subprocess.PIPE,
                                            stderr=subprocess.PIPE, text=True, env=env())
                if proc.stdout is None or proc.stdout.readline().strip() != "ready":
                    mine.close()
                    proc.kill()
                    _, err = proc.communicate()
                    raise RuntimeError(f"the proxy forkserver failed to start (exit {proc.returncode}): "
                                       f"{err.strip()[-500:]}")
                self._proc, self._control = proc, mine
            return self._control

    def close(self) -> None:
        """Stop it (its helpers go on): closing our end is its signal to exit."""
        with self._lock:
            self._closed = True
        self._stop(self._control)

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
