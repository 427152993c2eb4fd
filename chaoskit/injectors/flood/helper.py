"""The process behind load.flood: run the load until SIGTERM or the deadline, then stop its senders too.

Run as `python -m chaoskit.injectors.flood.helper TOKEN LOADSPEC_JSON UNTIL_EPOCH`; prints `ready` once sending.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time

from chaoskit.load.runner import run_load
from chaoskit.load.spec import LoadSpec


async def _flood(spec: LoadSpec, until: float) -> None:
    task = asyncio.ensure_future(run_load(spec))
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, task.cancel)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C at the terminal is the engine's to handle
    print("ready", flush=True)
    try:
        async with asyncio.timeout(max(0.0, until - time.time())):
            await task
    except (asyncio.CancelledError, TimeoutError):
        pass


def main(argv: list[str]) -> int:
    _token, spec_json, until = argv[0], argv[1], float(argv[2])
    spec = LoadSpec.model_validate_json(spec_json)
    try:
        asyncio.run(_flood(spec, until))
    finally:
        if os.getpgrp() == os.getpid():  # started by load.flood: we lead our own group, senders included
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
            os.killpg(0, signal.SIGKILL)  # senders still running; this ends us too
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
