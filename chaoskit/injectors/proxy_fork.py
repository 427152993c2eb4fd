"""The run's proxy forkserver: one process that imported the proxy servers once forks each proxy helper.

A proxy helper started as a new Python spends ~45 ms of CPU before it serves (interpreter, asyncio, the server);
forked from here it spends ~2 ms. Run as `python -S -P chaoskit/injectors/proxy_fork.py` (forkserver.Forkserver)
with its control socket (SOCK_SEQPACKET) as stdin; it prints `ready` once it has imported the servers. Each message
is a JSON request {"token", "args", "env"} (args as proxy_proc's after its token: SERVER LISTEN ...) carrying one
file descriptor, the socket the answer goes to. The child is what proxy_proc would be: its own session, the token
in its command line, `env` on top of the environment, the listening socket (in CHAOSKIT_PROXY_NETNS when set);
it answers `ready PID` or `error WHY` and serves. The forkserver exits when the run closes its end, or dies."""

from __future__ import annotations

import importlib
import json
import os
import signal
import socket
import sys

import setproctitle

from chaoskit.injectors import kv_notify_server, llm_proxy_server, proxy_proc, proxy_server

SERVERS = {m.__name__: m for m in (proxy_server, llm_proxy_server, kv_notify_server)}


def child(request: dict, answer: socket.socket) -> int:
    """In the forked child: become the helper proxy_proc would be and serve (never returns to the loop)."""
    token, (server, addr, *rest) = request["token"], request["args"]
    os.setsid()
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):  # the control socket and the run's pipes are not the helper's
        os.dup2(null, fd)
    os.close(null)
    setproctitle.setproctitle(f"{proxy_proc.__file__} {token} {server} {addr}")  # found by its token
    os.environ.update(request["env"])
    try:
        sock = proxy_proc.bind(addr)
    except OSError as e:
        answer.sendall(f"error cannot listen on {addr}: {e}\n".encode())
        return 1
    answer.sendall(f"ready {os.getpid()}\n".encode())
    answer.close()
    module = SERVERS.get(server) or importlib.import_module(server)  # another package's server: imported here
    return module.helper_main(sock, rest)


def serve(control: socket.socket) -> None:
    """Fork a helper for each request until the run closes its end."""
    while True:
        try:
            msg, fds, _, _ = socket.recv_fds(control, 1 << 20, 1)
        except InterruptedError:
            continue
        if not msg:
            return
        answer = socket.socket(fileno=fds[0])
        if os.fork() == 0:
            control.close()
            code = 1
            try:
                code = child(json.loads(msg), answer)
            finally:
                os._exit(code)
        answer.close()


def main() -> int:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C at the terminal is the engine's to handle
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # the helpers outlive it; nothing to wait for
    try:
        import uvloop  # noqa: F401  (what the helpers run on: imported once, here)
    except ImportError:
        pass
    control = socket.socket(fileno=0)
    print("ready", flush=True)
    serve(control)
    return 0


if __name__ == "__main__":
    sys.exit(main())
