"""eBPF probe overhead: the reference Triton's throughput under a fixed closed-loop load (8 concurrent
clients sending generate requests through the gateway) with all five probes attached and sampled every
second, against the same load with none attached, alternating A/B rounds in the same run.

RESULT keys: throughput_loss (fraction: 1 - with / without; goal <= 0.03), rps_without, rps_with.
"""

from __future__ import annotations

import asyncio
import os
import statistics
import tempfile
import time
from pathlib import Path

import aiohttp

from chaoskit.probes.ebpf import PROGRAMS, EbpfProbe, EbpfProbeSpec
from chaoskit.reference.deploy import Deployment, RefOptions

ROUNDS = int(os.environ.get("BENCH_ROUNDS", "5"))
ROUND_S = float(os.environ.get("BENCH_ROUND_S", "8"))
CONCURRENCY = 8


async def throughput(url: str, probes: list[EbpfProbe]) -> float:
    done = 0
    end = time.monotonic() + ROUND_S
    body = {"text_input": "benchmark prompt " * 4, "max_tokens": 8}

    async def client(session: aiohttp.ClientSession) -> None:
        nonlocal done
        while time.monotonic() < end:
            async with session.post(f"{url}/v2/models/tiny_lm/generate", json=body) as r:
                await r.read()
                done += r.status == 200

    async def sampler() -> None:
        while time.monotonic() < end:
            await asyncio.sleep(1.0)
            for p in probes:
                await p.measure()

    async with aiohttp.ClientSession() as session:
        await asyncio.gather(*(client(session) for _ in range(CONCURRENCY)), sampler())
    return done / ROUND_S


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        d = Deployment(Path(tmp) / "ref")
        facts = d.up(RefOptions(port=19100, replicas=1), say=lambda _m: None)
        without, with_ = [], []
        try:
            asyncio.run(throughput(facts["url"], []))  # warm up
            for r in range(ROUNDS):
                without.append(asyncio.run(throughput(facts["url"], [])))
                probes = [EbpfProbe(EbpfProbeSpec(type="ebpf", name=p, program=p)) for p in PROGRAMS]
                for p in probes:
                    p.preflight()
                with_.append(asyncio.run(throughput(facts["url"], probes)))
                for p in probes:
                    asyncio.run(p.close())
                print(f"round {r + 1}: without probes {without[-1]:.1f} req/s, with all 5 attached {with_[-1]:.1f} req/s")
        finally:
            d.down(say=lambda _m: None)
    a, b = statistics.mean(without), statistics.mean(with_)
    print(f"RESULT throughput_loss={1 - b / a:.4f} rps_without={a:.1f} rps_with={b:.1f}")


if __name__ == "__main__":
    main()
