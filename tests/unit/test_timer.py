"""The loop alarm (timerfd): fires never before its time, once per arming; re-arming replaces the time."""

from __future__ import annotations

import asyncio
import time

from chaoskit.load.timer import Alarm


def test_alarm_fires_at_its_time_once_and_rearming_replaces_it():
    async def main() -> None:
        loop = asyncio.get_running_loop()
        fired: list[float] = []
        alarm = Alarm(loop, lambda: fired.append(time.monotonic()))
        try:
            first = time.monotonic() + 0.02
            alarm.at(time.monotonic() + 0.005)
            alarm.at(first)  # replaces the 5 ms one
            await asyncio.sleep(0.1)
            assert len(fired) == 1 and fired[0] >= first
            past = time.monotonic() - 1
            alarm.at(past)  # already due: fires on the next loop turn
            await asyncio.sleep(0.01)
            assert len(fired) == 2
            assert 0.0002 <= alarm.lead <= 0.002  # learnt from the wake-ups, within its bounds
        finally:
            alarm.close()

    asyncio.run(main())
