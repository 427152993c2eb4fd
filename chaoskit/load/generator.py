"""The open-loop sender: every request leaves at its intended time whatever the server does; latency is
measured from that intended time (coordinated-omission correct), service time from the actual send."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Iterable
from pathlib import Path
from typing import Any

import aiohttp

from chaoskit.load.clients import Outcome, request_for, send
from chaoskit.load.fastclient import Pool, request_bytes
from chaoskit.load.prompts import exact_bytes, from_file, synthetic
from chaoskit.load.recorder import Recorder, failed_at
from chaoskit.load.spec import LoadSpec
from chaoskit.load.timer import Alarm

PROGRESS_S = 0.5  # how often a worker reports progress
WARM_S, WARM_MAX = 0.002, 16  # connections opened before the first send: 2 ms of sends (more open as needed)


def _prompts(spec: LoadSpec) -> list[str]:
    if spec.prompts_file:
        return from_file(spec.prompts_file)
    make = exact_bytes if spec.api == "triton" else synthetic  # tiny_lm counts bytes as tokens
    return [make(spec.prompt_tokens, spec.seed + i) for i in range(64)]


def requests(spec: LoadSpec) -> list[tuple[str, str, Any]]:
    """(method, URL, body) of each prompt, sent in turn."""
    return [request_for(spec.api, spec.url, spec.model, p, spec.max_tokens, spec.stream, spec.method, spec.body)
            for p in _prompts(spec)]


def poison_request(spec: LoadSpec) -> tuple[str, str, Any] | None:
    """(method, URL, body) of the spec's poison request (its file's text as the prompt), or None."""
    if spec.poison is None:
        return None
    prompt = Path(spec.poison.file).read_text().removesuffix("\n")
    return request_for(spec.api, spec.url, spec.model, prompt, spec.max_tokens, spec.stream, spec.method, spec.body)


def trace_headers(traceparent: str | None) -> dict[str, str] | None:
    """The headers every request carries when the run is traced (None: none, the requests are as before)."""
    return {"traceparent": traceparent} if traceparent else None


async def _at(due: float, send: Callable[[], Awaitable[None]], stopped: Callable[[], bool] | None) -> None:
    """Run `send()` at monotonic time `due`, unless the load was stopped by then."""
    await asyncio.sleep(max(0.0, due - time.monotonic()))
    if stopped is None or not stopped():
        await send()


def warm_count(spec: LoadSpec) -> int:
    return min(WARM_MAX, 1 + int(spec.rate / spec.workers * WARM_S))


def _good(spec: LoadSpec, e2e: float, ttft: float | None, itls: list[float], tokens: int) -> bool:
    slo = spec.slo
    if "e2e" in slo and e2e > slo["e2e"]:
        return False
    if "ttft" in slo and (ttft is None or ttft > slo["ttft"]):
        return False
    if "itl" in slo and itls and max(itls) > slo["itl"]:
        return False
    if "tpot" in slo and ttft is not None and tokens > 1 and (e2e - ttft) / (tokens - 1) > slo["tpot"]:
        return False
    return True


async def run(spec: LoadSpec, offsets: Iterable[float], start_epoch: float, rec: Recorder,
              progress: Callable[[Recorder, int], None] | None = None, group_by: str | None = None,
              stopped: Callable[[], bool] | None = None, traceparent: str | None = None) -> None:
    """Send at start_epoch + offset for each offset; record into `rec` (and, with group_by, also into the
    recorder of the group named by that response header). Once `stopped()` holds nothing more is sent; what is
    in flight still completes (or times out) before this returns. `traceparent`: sent on every request (built
    into the prebuilt request bytes: no cost per request)."""
    t0 = time.monotonic() + (start_epoch - time.time())  # monotonic, not loop.time(): uvloop's is in ms
    cap = asyncio.Semaphore(spec.concurrency_cap) if spec.concurrency_cap else None
    conn = aiohttp.TCPConnector(limit=0, ttl_dns_cache=300, force_close=False)
    fast = Pool(spec.url, group_by) if spec.url.startswith("http://") else None  # https goes through aiohttp
    headers = trace_headers(traceparent)
    payloads = [(method, url, body, request_bytes(method, url, body, headers) if fast else None)
                for method, url, body in requests(spec)]
    tasks: set[asyncio.Task] = set()
    in_flight = 0
    poisoned = poison_request(spec)
    poison = (*poisoned, request_bytes(*poisoned, headers) if fast else None) if poisoned else None

    def request(i: int) -> tuple[str, str, Any, bytes | None]:
        return payloads[i % len(payloads)]

    streamed = spec.stream and spec.api != "http"

    def record(out: Outcome, intended: float, sent: float) -> None:
        if out.error:
            waited = failed_at(spec.timeout, time.monotonic() - intended)
            rec.failure(out.error, waited, streamed)
            if group_by is not None:
                rec.group(out.group).failure(out.error, waited, streamed)
            return
        end = out.token_times[-1] if out.token_times else time.monotonic()
        ttft = out.token_times[0] - intended if streamed and out.token_times else None
        itls = [b - a for a, b in zip(out.token_times, out.token_times[1:], strict=False)]
        e2e = end - intended
        good = _good(spec, e2e, ttft, itls, out.tokens)
        rec.success(e2e, end - sent, ttft, itls, out.tokens, good)
        if group_by is not None:
            rec.group(out.group).success(e2e, end - sent, ttft, itls, out.tokens, good)

    def fire(i: int, intended: float) -> bool:
        """The hot path: an idle keep-alive connection, no cap -> send now, no task; False if not possible."""
        nonlocal in_flight
        conn = fast.take_idle() if fast is not None and cap is None else None
        if conn is None:
            return False
        raw = request(i)[3]
        assert fast is not None and raw is not None
        sent = time.monotonic()
        rec.sent_at(sent - intended)
        in_flight += 1

        def done(out: Outcome) -> None:
            nonlocal in_flight
            in_flight -= 1
            record(out, intended, sent)
            pump()  # a busy loop reaches the next send from here first

        fast.fire(conn, raw, spec.api, spec.stream, spec.timeout, done, spec.stall_timeout)
        return True

    schedule = enumerate(offsets)
    due: tuple[int, float] | None = next(schedule, None)
    pumping = spin_pending = False

    def pump() -> None:
        """Send everything due by now, then wait for the next send: in epoll on the alarm until `alarm.lead`
        before it, then by yielding to the loop (a wake-up can come late; a yield cannot). Runs from the
        alarm, from the loop, and after each completion (a busy loop reaches a due send there first)."""
        nonlocal due, pumping, spin_pending
        if stopped is not None and stopped():
            due = None  # the rest of the schedule is dropped
        if pumping or due is None:
            return
        pumping = True
        try:
            while due is not None and t0 + due[1] <= time.monotonic():
                i, intended = due[0], t0 + due[1]
                if not fire(i, intended):
                    task = asyncio.create_task(one(i, intended))
                    tasks.add(task)
                    task.add_done_callback(tasks.discard)
                due = next(schedule, None)
        finally:
            pumping = False
        if due is None:
            return
        if t0 + due[1] - time.monotonic() > alarm.lead:
            alarm.at(t0 + due[1] - alarm.lead)
        elif not spin_pending:
            spin_pending = True
            loop.call_soon(spin)

    def spin() -> None:
        nonlocal spin_pending
        spin_pending = False
        pump()

    async def one(i: int, intended: float, payload: tuple[str, str, Any, bytes | None] | None = None) -> None:
        nonlocal in_flight
        method, url, body, raw = payload or request(i)
        if cap is not None:
            await cap.acquire()
        in_flight += 1
        try:
            sent = time.monotonic()
            rec.sent_at(sent - intended)
            if fast is not None and raw is not None:
                out = await fast.send(raw, spec.api, spec.stream, spec.timeout, spec.stall_timeout)
            else:
                out = await send(session, spec.api, method, url, body, spec.stream, spec.timeout, group_by,
                                 spec.stall_timeout, headers)
        finally:
            in_flight -= 1
            if cap is not None:
                cap.release()
        record(out, intended, sent)

    async with aiohttp.ClientSession(connector=conn, auto_decompress=False,
                                     timeout=aiohttp.ClientTimeout(total=None)) as session:
        sweep = min(0.05, spec.stall_timeout / 10) if spec.stall_timeout else 0.05  # stalls seen within a tenth
        sweeper = asyncio.create_task(fast.sweep_timeouts(sweep)) if fast is not None else None
        if fast is not None and cap is None:
            await fast.warm(warm_count(spec))
        loop = asyncio.get_running_loop()
        alarm = Alarm(loop, pump)
        poisoning, poison_at = None, t0 + (spec.poison.at if spec.poison is not None else 0.0)
        if poison is not None:  # once, at its time, unless stopped by then (a task: waited for below)
            poisoning = asyncio.create_task(_at(poison_at, lambda: one(-1, poison_at, poison), stopped))
            tasks.add(poisoning)
            poisoning.add_done_callback(tasks.discard)
        next_report = time.monotonic()
        try:
            if due is not None:
                alarm.at(t0 + due[1] - alarm.lead)
            while due is not None:  # the alarm and the completions do the sending; this only reports
                await asyncio.sleep(0.05)
                if stopped is not None and stopped():
                    due = None
                if progress is not None and time.monotonic() >= next_report:
                    progress(rec, in_flight)
                    next_report = time.monotonic() + PROGRESS_S
        finally:
            alarm.close()
        if poisoning is not None and stopped is not None and stopped() and time.monotonic() < poison_at:
            poisoning.cancel()  # the load was stopped before the poison's time: it is not sent (nor waited for)
        while tasks or in_flight:
            if tasks:
                await asyncio.wait(set(tasks), timeout=0.5)
            else:
                await asyncio.sleep(0.05)
            if progress is not None and time.monotonic() >= next_report:
                progress(rec, in_flight)
                next_report = time.monotonic() + PROGRESS_S
        if sweeper is not None:
            sweeper.cancel()
    if fast is not None:
        fast.close()
