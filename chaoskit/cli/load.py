"""`chaoskit load URL ...`: an open-loop load run with a live view and a final table (or JSON)."""

from __future__ import annotations

import json
from pathlib import Path

import typer
from pydantic import ValidationError
from rich.live import Live

from chaoskit.errors import ChaoskitError, SpecError
from chaoskit.term import Table, console

out = console()
err = console(stderr=True)


def parse_slo(text: str | None) -> dict[str, str]:
    """'ttft:200ms,e2e:950ms' -> {'ttft': '200ms', 'e2e': '950ms'}."""
    slo: dict[str, str] = {}
    for part in (text or "").split(","):
        if not part.strip():
            continue
        key, sep, value = part.partition(":")
        if not sep:
            raise SpecError(f"--slo {part!r}: expected METRIC:LIMIT, e.g. ttft:200ms,e2e:950ms")
        slo[key.strip()] = value.strip()
    return slo


def _validation(e: ValidationError) -> SpecError:
    return SpecError([f"--{'.'.join(map(str, x['loc'])).replace('_', '-')}: "
                      f"{str(x['msg']).removeprefix('Value error, ')}" for x in e.errors()])


def final_table(s: dict) -> Table:
    t = Table(title=f"load: {s['sent']} of {s['scheduled']} scheduled sent ({s['sent_on_time_ratio']:.1%} on time), "
                    f"{s['completed_ratio']:.1%} completed ({s['completed_rps']:.1f}/s of {s['requested_rps']:g}/s "
                    f"requested), {s['workers']} {s['sender']} worker(s)")
    t.add_column("metric")
    for q in ("p50", "p90", "p99", "p999"):
        t.add_column(q + " ms", justify="right")
    for label, prefix in (("latency, all requests (failures at timeout)", "all_"),
                          ("latency (successes, from intended send)", ""), ("service (from actual send)", "service_"),
                          ("TTFT, all requests", "all_ttft_"), ("TTFT (successes)", "ttft_"), ("inter-token", "itl_"),
                          ("TPOT", "tpot_")):
        if f"{prefix}p50_ms" in s:
            t.add_row(label, *(f"{s[f'{prefix}{q}_ms']:.2f}" for q in ("p50", "p90", "p99", "p999")))
    t.caption = (f"errors {s['errors'] or 0} (rate {s['error_rate']:.4f}) · goodput {s['goodput_rps']:.1f}/s · "
                 f"late sends (>1 ms) {s['late_sends']} ({s['late_share']:.2%}), max {s['max_late_ms']:.2f} ms")
    return t


def load(
    url: str = typer.Argument(..., help="base URL (openai, triton) or full URL (http)"),
    api: str = typer.Option("http", help="openai | openai-chat | triton | http"),
    rate: float = typer.Option(..., help="requests per second"),
    duration: str = typer.Option("10s", help="how long to send"),
    arrival: str = typer.Option("poisson", help="constant | poisson | gamma | ramp | replay"),
    burstiness: float = typer.Option(1.0, help="gamma: squared CV of gaps (1 = Poisson)"),
    ramp_to: float | None = typer.Option(None, help="ramp: final rate"),
    trace: str | None = typer.Option(None, help="replay: file of offsets in seconds"),
    model: str | None = typer.Option(None, help="model name"),
    prompt_tokens: int = typer.Option(128, help="prompt length in tokens"),
    max_tokens: int = typer.Option(16, help="tokens to generate"),
    stream: bool = typer.Option(True, "--stream/--no-stream", help="stream tokens (TTFT, ITL)"),
    prompts_file: str | None = typer.Option(None, help="one prompt per line instead of the synthetic corpus"),
    timeout: str = typer.Option("30s", help="per request"),
    stall_timeout: str | None = typer.Option(None, help="give a stream up as stream_stalled after this long "
                                                        "without a token (e.g. 2s; picks the python sender)"),
    concurrency_cap: int | None = typer.Option(None, help="most requests in flight"),
    slo: str | None = typer.Option(None, help="goodput limits, e.g. ttft:200ms,e2e:950ms"),
    workers: int = typer.Option(1, help="sender processes (one per core scales)"),
    sender: str = typer.Option("auto", help="native (C, plain http://) | python (asyncio; aiohttp for https) | "
                                            "auto: native when it applies"),
    seed: int = typer.Option(0),
    as_json: Path | None = typer.Option(None, "--json", help="also write the summary as JSON here"),
) -> None:
    """Open-loop load: requests leave on schedule whatever the server does; latency counts from the
    intended send time (coordinated omission corrected); service time from the actual send beside it."""
    import asyncio

    from chaoskit.load.runner import run_load
    from chaoskit.load.spec import LoadSpec
    from chaoskit.model.types import written

    try:
        try:
            given = dict(url=url, api=api, rate=rate, duration=duration, arrival=arrival, burstiness=burstiness,
                         ramp_to=ramp_to, trace=trace, model=model, prompt_tokens=prompt_tokens,
                         max_tokens=max_tokens, stream=stream, prompts_file=prompts_file, timeout=timeout,
                         stall_timeout=stall_timeout, concurrency_cap=concurrency_cap, slo=parse_slo(slo),
                         workers=workers, seed=seed, sender=sender)
            spec = LoadSpec.model_validate(given, context=written())  # --duration 10: write 10s (or 10ms)
        except ValidationError as e:
            raise _validation(e) from None
        live_table = Table.grid(padding=(0, 2))

        def view(p: dict) -> Table:
            t = Table(title=f"chaoskit load {spec.api} {spec.url} @ {spec.rate:g}/s ({spec.arrival})")
            for col in ("elapsed", "sent", "achieved/s", "in flight", "ok", "errors", "late >1ms"):
                t.add_column(col, justify="right")
            el = max(p.get("elapsed_s", 0.0), 1e-9)
            t.add_row(f"{el:.1f}s", str(p.get("sent", 0)), f"{p.get('sent', 0) / el:.1f}", str(p.get("in_flight", 0)),
                      str(p.get("ok", 0)), str(p.get("errors", 0)), str(p.get("late", 0)))
            return t

        if out.is_terminal:
            with Live(live_table, console=out, refresh_per_second=4, transient=True) as live:
                summary = asyncio.run(run_load(spec, lambda p: live.update(view(p))))
        else:
            summary = asyncio.run(run_load(spec))
    except ChaoskitError as e:
        for line in str(e).splitlines():
            err.print(f"[red]error:[/] {line}", highlight=False, soft_wrap=True)
        raise typer.Exit(e.exit_code) from None
    summary.pop("recorder")
    out.print(final_table(summary))
    if as_json:
        as_json.write_text(json.dumps(summary, indent=2))
    if summary["sent"] and summary["ok"] == 0:
        err.print(f"[red]every request failed[/]: {summary['errors']}")
        raise typer.Exit(1)
