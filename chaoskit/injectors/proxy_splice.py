"""The proxies' relay for a connection no fault touches: the kernel moves its bytes (splice(2) through a pipe, one
thread per direction, no copy into Python), so an untouched connection runs near the speed of a direct one.

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
    """Both directions of one connection, each in its own thread; the sockets are this relay's from now on."""

    def __init__(self, client: socket.socket, upstream: socket.socket):
        self.socks = (client, upstream)
        self._left = 2
        self._lock = threading.Lock()
        for s in self.socks:
            s.setblocking(True)
        for src, dst in ((client, upstream), (upstream, client)):
            threading.Thread(target=self._pump, args=(src, dst), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:
        r, w = os.pipe()
        with contextlib.suppress(OSError):
            fcntl.fcntl(w, F_SETPIPE_SZ, CHUNK)  # up to /proc/sys/fs/pipe-max-size; the default 64 KiB else
        try:
            while n := os.splice(src.fileno(), w, CHUNK, flags=os.SPLICE_F_MOVE):
                while n:
                    n -= os.splice(r, dst.fileno(), n, flags=os.SPLICE_F_MOVE)
            with contextlib.suppress(OSError):
                dst.shutdown(socket.SHUT_WR)  # EOF from src: pass it on, the other direction may go on
        except OSError:  # a reset, or the other direction gave up: end both
            for s in self.socks:
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)
        finally:
            os.close(r)
            os.close(w)
            self._done()

    def _done(self) -> None:
        with self._lock:
            self._left -= 1
            last = self._left == 0
        if last:
            for s in self.socks:
                s.close()
