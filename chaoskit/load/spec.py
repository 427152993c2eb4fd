"""What one load run is: target, API, schedule, request shape, SLOs (shared by `chaoskit load` and the slo probe)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from chaoskit.model.types import Duration, StrictModel, check_url


class Poison(StrictModel):
    """One extra request sent once at a chosen time (a poison request: a prompt that crashes the engine)."""

    file: str = Field(min_length=1, description="the request's prompt: this file's whole text (a final newline "
                      "dropped), sent with the load's api, model and max_tokens")
    at: Duration = Field(0.0, ge=0, description="when, after the load's first intended send")

    @field_validator("file")
    @classmethod
    def _readable(cls, v: str) -> str:
        if "{" not in v and not Path(v).is_file():  # a placeholder is resolved (and checked) at run time
            raise ValueError(f"poison.file {v!r}: no such file")
        return v


class LoadSpec(StrictModel):
    url: str = Field(min_length=1, description="base URL (openai, triton) or full URL (http)")
    api: Literal["openai", "openai-chat", "triton", "http"] = "http"
    model: str | None = Field(None, description="model name (openai: required; triton: default tiny_lm)")
    rate: float = Field(gt=0, description="requests per second (the schedule's mean)")
    duration: Duration = Field(description="how long to send")
    arrival: Literal["constant", "poisson", "gamma", "ramp", "replay"] = "poisson"
    burstiness: float = Field(1.0, gt=0, description="gamma: squared coefficient of variation of the gaps")
    ramp_to: float | None = Field(None, gt=0, description="ramp: the rate at the end")
    trace: str | None = Field(None, description="replay: file of send offsets (seconds)")
    timeout: Duration = Field(30.0, description="per request")
    stall_timeout: Duration | None = Field(None, gt=0, description="give a stream up as stream_stalled when no "
                                           "token came for this long after the response head or the previous "
                                           "token (needs the python sender; auto picks it)")
    concurrency_cap: int | None = Field(None, gt=0, description="most requests in flight; the rest wait (and "
                                                                "their wait counts: latency is from the intended send)")
    prompt_tokens: int = Field(128, gt=0)
    max_tokens: int = Field(16, gt=0)
    stream: bool = Field(True, description="openai/triton: stream tokens (SSE) to measure TTFT and ITL")
    prompts_file: str | None = None
    method: Literal["GET", "POST"] = "GET"
    body: Any = None
    slo: dict[Literal["ttft", "e2e", "tpot", "itl"], Duration] = Field(
        default_factory=dict, description="per-request limits for goodput, e.g. {ttft: 200ms, e2e: 950ms}")
    workers: int = Field(1, ge=1, le=64, description="sender processes")
    sender: Literal["auto", "native", "python"] = Field(
        "auto", description="native: the C sender (plain http://, built with the system C compiler on first use); "
                            "python: asyncio (and aiohttp for https); auto: native when it applies")
    seed: int = 0
    poison: Poison | None = Field(None, description="send one request from a file at a chosen time, once (the "
                                  "first sender process; needs the python sender, auto picks it)")

    @field_validator("url")
    @classmethod
    def _url(cls, v: str) -> str:
        if not v.startswith(("http://", "https://")):
            raise ValueError(f"expected an http:// or https:// URL (got {v!r})")
        return check_url(v)

    @model_validator(mode="after")
    def _shape(self) -> LoadSpec:
        if self.api.startswith("openai") and not self.model:
            raise ValueError("api openai needs model")
        if self.arrival == "replay" and not self.trace:
            raise ValueError("arrival replay needs trace")
        if self.poison is not None and self.poison.at >= self.duration:
            raise ValueError(f"poison.at ({self.poison.at:g}s) must come before the load's end (duration "
                             f"{self.duration:g}s)")
        if self.poison is not None and self.sender == "native":
            raise ValueError("poison needs the python sender (the native sender sends the load's prompts only); "
                             "use sender: python or auto")
        if self.stall_timeout is not None and self.sender == "native":
            raise ValueError("stall_timeout needs the python sender: the native sender (sender.c) does not tell "
                             "stalled, truncated or malformed streams apart; use sender: python or auto (auto "
                             "picks python when stall_timeout is set)")
        return self
