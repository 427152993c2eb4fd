"""load.flood: a traffic flood as a fault (a noisy tenant, a burst of long contexts): open-loop load from a
helper process for as long as the fault lasts; revert = the helper and its senders stop. `poison: {file, at}`
also sends one request with that file's text as its prompt, once, `at` after the flood starts."""

from __future__ import annotations

import time
import uuid
from typing import Any, ClassVar, Literal

from pydantic import Field, JsonValue

from chaoskit.injectors import helper_proc
from chaoskit.load.spec import LoadSpec, Poison
from chaoskit.model.types import Duration, StrictModel, Url
from chaoskit.targets.process import ProcessRef

DEFAULT_TIMEOUT_S = 30.0


class FloodLoad(StrictModel):
    """The flood's requests: LoadSpec's fields except duration (the step's duration is the flood's)."""

    url: Url = Field(min_length=1, pattern=r"^https?://", description="base URL (openai, triton) or full URL (http)")
    api: Literal["openai", "openai-chat", "triton", "http"] = "triton"
    model: str | None = Field(None, description="model name (openai: required; triton: default tiny_lm)")
    rate: float = Field(gt=0, le=5000, description="requests per second")
    arrival: Literal["constant", "poisson", "gamma", "replay"] = "poisson"
    burstiness: float = Field(1.0, gt=0, description="gamma: squared coefficient of variation of the gaps")
    trace: str | None = Field(None, description="replay: file of send offsets (seconds), e.g. bursts")
    prompts_file: str | None = Field(None, description="prompts, one per line, used in turn")
    timeout: Duration = Field(DEFAULT_TIMEOUT_S, gt=0, description="per request")
    concurrency_cap: int | None = Field(None, gt=0, description="most requests in flight")
    prompt_tokens: int = Field(128, gt=0)
    max_tokens: int = Field(16, gt=0)
    stream: bool = False
    method: Literal["GET", "POST"] = "GET"
    body: Any = None
    workers: int = Field(1, ge=1, le=16, description="sender processes")
    seed: int = 1
    poison: Poison | None = Field(None, description="one request from a file at a chosen time in the flood (a "
                                  "poison request: {file, at}); the flood then uses the python sender")


class FloodSpec(StrictModel):
    type: Literal["load.flood"]
    load: FloodLoad = Field(description="what to send (like the slo probe's load, without duration)")


class FloodRecord(helper_proc.HelperRecord):
    """load.flood's record: its token; once started, the helper and the load it sends (as JSON, for the reader of
    the ledger: revert needs the token alone)."""

    helper: ProcessRef | None = None
    load: JsonValue = None


class Flood(helper_proc.HelperFault[FloodSpec, FloodRecord]):
    type: ClassVar[str] = "load.flood"
    host_needs: ClassVar[frozenset[str]] = frozenset({"native-sender"})
    helper: ClassVar[str | None] = "chaoskit.injectors.flood.helper"
    summary: ClassVar[str] = "send an open-loop request flood from a helper process (revert: it stops)"
    Spec = FloodSpec
    spec: FloodSpec
    Record = FloodRecord

    def load_spec(self, seconds: float) -> LoadSpec:
        return LoadSpec(**self.spec.load.model_dump(), duration=seconds)

    def preflight(self) -> None:
        self.load_spec(1.0)  # the combination is a valid load (e.g. openai needs a model)

    def plan(self) -> list[str]:
        ld = self.spec.load
        poison = f", and once, {ld.poison.at:g}s in, the request in {ld.poison.file}" if ld.poison else ""
        return [f"start a load helper sending {ld.rate:g} req/s ({ld.arrival}, {ld.api}, {ld.prompt_tokens} prompt "
                f"tokens, {ld.max_tokens} max) to {ld.url}{poison}; revert: SIGTERM it (it also stops by itself "
                f"after {self.ctx.lifetime_s:g}s)"]

    def prepare(self) -> FloodRecord:
        return FloodRecord(token=f"chaoskit-flood-{uuid.uuid4().hex}")

    def apply(self, record: FloodRecord) -> FloodRecord:
        spec = self.load_spec(self.ctx.lifetime_s)
        ref = helper_proc.spawn(self.helper, record.token,
                                [spec.model_dump_json(), f"{time.time() + self.ctx.lifetime_s:.3f}"],
                                f"load flood to {spec.url}")
        return record.model_copy(update={"helper": ref, "load": spec.model_dump(mode="json")})
