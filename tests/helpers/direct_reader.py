"""Test helper: read a block device with O_DIRECT in a loop, printing `monotonic_time total_bytes` every 50 ms."""

import mmap
import os
import sys
import time

CHUNK = 64 * 1024


def main(dev: str) -> None:
    fd = os.open(dev, os.O_RDONLY | os.O_DIRECT)
    size = os.lseek(fd, 0, os.SEEK_END)
    buf = mmap.mmap(-1, CHUNK)  # page-aligned, as O_DIRECT wants
    total, off, last = 0, 0, 0.0
    while True:
        n = os.preadv(fd, [buf], off)
        total += n
        off = (off + CHUNK) % (size - CHUNK)
        now = time.monotonic()
        if now - last >= 0.05:
            print(f"{now:.4f} {total}", flush=True)
            last = now


if __name__ == "__main__":
    main(sys.argv[1])
