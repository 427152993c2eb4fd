"""The process behind host.memory_pressure: allocate and touch N bytes, hold them, exit on SIGTERM or deadline.

Run as `python -m chaoskit.injectors.memory_holder TOKEN BYTES UNTIL_EPOCH`; prints `ready` once
every page is resident. The TOKEN argument lets a fresh process find it again (revert by marker).
"""

from __future__ import annotations

import mmap
import signal
import sys
import time

PAGE = mmap.PAGESIZE


def main(argv: list[str]) -> int:
    _token, nbytes, until = argv[0], int(argv[1]), float(argv[2])
    stop = False

    def _stop(*_: object) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C at the terminal is the engine's to handle
    buf = mmap.mmap(-1, max(nbytes, PAGE), flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    for off in range(0, len(buf), PAGE):  # touch every page so it is really resident
        buf[off] = 1
    print("ready", flush=True)
    while not stop and time.time() < until:
        time.sleep(0.05)
    buf.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
