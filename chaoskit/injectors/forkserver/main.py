"""The run's proxy forkserver: one process that imported the proxy servers once forks each proxy helper.

A proxy helper started as a new Python spends ~45 ms of CPU before it serves (interpreter, asyncio, the server);
forked from here it spends ~2 ms. Run as `python -S -P chaoskit/injectors/forkserver/main.py` (forkserver.Forkserver)
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
from pathlib import Path
from types import ModuleType

import setproctitle

from chaoskit.injectors.kv_notify import server as kv_notify_server
from chaoskit.injectors.llm_proxy import server as llm_proxy_server
from chaoskit.injectors.mcp_proxy import server as mcp_proxy_server
from chaoskit.injectors.proxy import helper as proxy_proc
from chaoskit.injectors.proxy import server as proxy_server

SERVERS = {m.__name__: m for m in (proxy_server, llm_proxy_server, mcp_proxy_server, kv_notify_server)}


def child(request: dict, answer: socket.socket) -> int:
    """In the forked child (the control socket closed): become the helper proxy_proc would be, say `ready PID`
    (or `error WHY`) on `answer`, and serve."""
    try:
        sock, rest, module = become(request)
    except Exception as e:  # whatever it is, the run reads why (proxy_proc's would be on its stderr)
        answer.sendall(f"error {e if isinstance(e, RuntimeError) else f'{type(e).__name__}: {e}'}\n".encode())
        return 1
    answer.sendall(f"ready {os.getpid()}\n".encode())
    answer.close()
    return module.helper_main(sock, rest)


def become(request: dict) -> tuple[socket.socket, list[str], ModuleType]:
    """Own session, standard streams on /dev/null, the token in the command line (the process name kept), the
    request's environment, the server module, the listening socket."""
    token, (server, addr, *rest) = request["token"], request["args"]
    os.setsid()
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    null = os.open(os.devnull, os.O_RDWR)  # fd 0 itself when the control socket's was the lowest free
    for fd in (0, 1, 2):  # the control socket and the run's pipes are not the helper's
        if fd != null:
            os.dup2(null, fd)
    if null > 2:
        os.close(null)
    name = Path("/proc/self/comm").read_text().strip()
    setproctitle.setproctitle(f"{proxy_proc.__file__} {token} {server} {addr}")  # found by its token
    setproctitle.setthreadtitle(name)  # its name stays the interpreter's, as a helper proxy_proc started
    if token not in Path("/proc/self/cmdline").read_bytes().decode(errors="replace"):
        raise RuntimeError("its command line does not show its token (setproctitle): revert could not find it")
    os.environ.update(request["env"])
    module = SERVERS.get(server) or importlib.import_module(server)  # another package's server: imported here
    try:
        sock = proxy_proc.bind(addr)
    except OSError as e:
        raise RuntimeError(f"cannot listen on {addr}: {e}") from None
    return sock, rest, module


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
