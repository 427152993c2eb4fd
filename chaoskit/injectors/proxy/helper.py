"""A proxy helper (network.proxy, llm.proxy): listen first, say `ready`, then import the server and serve.

Run as `python -S -P chaoskit/injectors/proxy/helper.py TOKEN SERVER LISTEN UPSTREAM CONFIG_JSON UNTIL_EPOCH`
(helper_proc.spawn), SERVER the server's module (chaoskit.injectors.proxy.server or llm_proxy_server). From the
moment it is listening the kernel completes and queues connections, so the fault is in effect at `ready`; the
server (asyncio, ~50 ms to import) accepts them as soon as it runs. With CHAOSKIT_PROXY_NETNS (intercept) it first
joins that network namespace. In a run, proxy_fork forks the same helper from a process that imported the servers."""

from __future__ import annotations

import importlib
import os
import signal
import socket
import sys


def listen(addr: str) -> socket.socket:
    """The listening socket of `host:port` (as asyncio.start_server makes it: SO_REUSEADDR, backlog 1024). `[::]`
    listens on IPv4 and IPv6 (IPv4 alone where the kernel has IPv6 off): an intercepting proxy gets both."""
    host, _, port = addr.rpartition(":")
    host = host.strip("[]") or "127.0.0.1"
    try:
        sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    except OSError:
        if host != "::":
            raise
        host, sock = "0.0.0.0", socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if host == "::":
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        sock.bind((host, int(port)))
        sock.listen(1024)
    except OSError:
        sock.close()
        raise
    sock.setblocking(False)
    return sock


def enter_netns(path: str) -> None:
    """Move this (still single-threaded) process into the network namespace at `path`: every socket it makes,
    the listening one and those to the upstream, is then the namespace's."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    fd = os.open(path, os.O_RDONLY)
    try:
        if libc.setns(fd, 0x40000000) != 0:  # CLONE_NEWNET
            err = ctypes.get_errno()
            raise OSError(err, f"setns({path}): {os.strerror(err)}")
    finally:
        os.close(fd)


def bind(addr: str) -> socket.socket:
    """The helper's listening socket: in CHAOSKIT_PROXY_NETNS when set (intercept: the proxy runs in the target's
    namespace)."""
    if ns := os.environ.get("CHAOSKIT_PROXY_NETNS"):
        enter_netns(ns)
    return listen(addr)


def main(argv: list[str]) -> int:
    server, addr = argv[1], argv[2]
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C at the terminal is the engine's to handle
    try:
        sock = bind(addr)
    except OSError as e:
        print(f"cannot listen on {addr}: {e}", file=sys.stderr, flush=True)
        return 1
    print("ready", flush=True)
    return importlib.import_module(server).helper_main(sock, argv[3:])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
