"""The proxies' relay for a connection no fault touches: the kernel moves its bytes (splice(2) through a pipe, one
thread per direction, no copy into Python): about 3x the throughput of the Python relay on the benchmark box
(docs/benchmarks.md, bench/proxy_bench.py).

Standard library only (loaded by the proxy helpers). Each direction passes its EOF on as a half-close; a reset or
error on either side ends both directions (both sockets shut down), and the sockets close when both are done.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import socket
import threading

CHUNK = 1 << 20
F_SETPIPE_SZ = 1031  # linux/fcntl.h


class Relay:
    """Both directions of one connection, each in its own thread with its own pipe; the sockets are this relay's
    from now on. `start()` raises OSError or RuntimeError when the pipes or threads cannot be had (out of file
    descriptors or threads): then nothing of it is left, and the caller still owns the sockets."""

    def __init__(self, client: socket.socket, upstream: socket.socket):
        self.socks = (client, upstream)
        self._left = 2
        self._lock = threading.Lock()

    def start(self) -> None:
        pipes: list[tuple[int, int]] = []
        try:
            for _ in range(2):
                pipes.append(os.pipe())
                with contextlib.suppress(OSError):  # up to /proc/sys/fs/pipe-max-size; the default 64 KiB else
                    fcntl.fcntl(pipes[-1][1], F_SETPIPE_SZ, CHUNK)
            threads = [threading.Thread(target=self._pump, args=(src, dst, pipe), daemon=True)
                       for (src, dst), pipe in zip(((self.socks[0], self.socks[1]), (self.socks[1], self.socks[0])),
                                                   pipes, strict=True)]
            for s in self.socks:
                s.setblocking(True)
            threads[0].start()
        except BaseException:
            for r, w in pipes:
                os.close(r)
                os.close(w)
            raise
        try:
            threads[1].start()
        except BaseException:  # the first direction runs: end it; its thread closes its pipe and the sockets
            os.close(pipes[1][0])
            os.close(pipes[1][1])
            self._end_both()
            self._done()
            raise RelayStarted from None

    def _pump(self, src: socket.socket, dst: socket.socket, pipe: tuple[int, int]) -> None:
        r, w = pipe
        try:
            while n := os.splice(src.fileno(), w, CHUNK, flags=os.SPLICE_F_MOVE):
                while n:
                    n -= os.splice(r, dst.fileno(), n, flags=os.SPLICE_F_MOVE)
            with contextlib.suppress(OSError):
                dst.shutdown(socket.SHUT_WR)  # EOF from src: pass it on, the other direction may go on
        except OSError:  # a reset, or the other direction gave up: end both
            self._end_both()
        finally:
            os.close(r)
            os.close(w)
            self._done()

    def _end_both(self) -> None:
        for s in self.socks:
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)

    def _done(self) -> None:
        with self._lock:
            self._left -= 1
            last = self._left == 0
        if last:
            for s in self.socks:
                s.close()


class RelayStarted(RuntimeError):
    """The second direction could not start: the relay ends the connection and closes its sockets itself."""
