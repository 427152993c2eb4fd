"""prometheus probe: scrape a /metrics endpoint (prometheus-client's parser) and compare a selected series,
or its per-second rate from two scrapes; or run a PromQL query against a Prometheus server."""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from pydantic import Field, model_validator

from chaoskit.model.types import Duration
from chaoskit.probes.base import Probe, ProbeSpecBase, http_session

if TYPE_CHECKING:
    import aiohttp  # types only: http_session (probes.base) imports it where a session is made


class PromProbeSpec(ProbeSpecBase):
    type: Literal["prometheus"]
    url: str | None = Field(None, description="a /metrics endpoint to scrape")
    metric: str | None = Field(None, description="sample name as exposed, e.g. nv_inference_count or "
                                                 "gateway_requests_total")
    labels: dict[str, str] = Field(default_factory=dict, description="label selector (exact match)")
    aggregate: Literal["sum", "max", "min", "avg"] = Field("sum", description="over the matching series")
    rate_window: Duration | None = Field(None, gt=0, description="also scrape again after this and report "
                                                                 "`rate` per second")
    prometheus: str | None = Field(None, description="a Prometheus server URL for `query`")
    query: str | None = Field(None, description="PromQL; `value` = the aggregate of the result vector")
    expect_keys: ClassVar[tuple[str, ...]] = ("value", "rate", "series")

    @model_validator(mode="after")
    def _one_source(self) -> PromProbeSpec:
        scrape, promql = self.url is not None, self.prometheus is not None
        if scrape == promql:
            raise ValueError("give either url + metric (scrape) or prometheus + query (PromQL)")
        if scrape and not self.metric:
            raise ValueError("scraping needs metric")
        if promql and not self.query:
            raise ValueError("prometheus needs query")
        if promql and self.rate_window:
            raise ValueError("rate_window is for scraping; use rate() in PromQL")
        return self


def _aggregate(values: list[float], how: str) -> float | None:
    if not values:
        return None
    return {"sum": sum, "max": max, "min": min, "avg": lambda v: sum(v) / len(v)}[how](values)


def select(text: str, metric: str, labels: dict[str, str]) -> list[float]:
    """Values of the samples named `metric` whose labels include `labels`."""
    from prometheus_client.parser import text_string_to_metric_families

    out = []
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == metric and all(s.labels.get(k) == v for k, v in labels.items()):
                out.append(float(s.value))
    return out


class PromProbe(Probe):
    type: ClassVar[str] = "prometheus"
    summary: ClassVar[str] = "a metric from a /metrics endpoint (value, rate) or a PromQL query"
    Spec = PromProbeSpec
    spec: PromProbeSpec

    def __init__(self, spec: PromProbeSpec):
        super().__init__(spec)
        self._session: aiohttp.ClientSession | None = None

    def _sess(self) -> aiohttp.ClientSession:
        if self._session is None:
            self._session = http_session(self.spec.timeout)
        return self._session

    async def _scrape(self) -> list[float]:
        assert self.spec.url and self.spec.metric
        async with self._sess().get(self.spec.url) as r:
            r.raise_for_status()
            text = await r.text()
        return select(text, self.spec.metric, self.spec.labels)

    async def measure(self) -> dict[str, Any]:
        s = self.spec
        if s.prometheus:
            async with self._sess().get(s.prometheus.rstrip("/") + "/api/v1/query", params={"query": s.query}) as r:
                data = await r.json()
            if data.get("status") != "success":
                raise RuntimeError(f"PromQL error: {data.get('error', data)}")
            result = data["data"]["result"]
            values = [float(x["value"][1]) for x in result] if data["data"]["resultType"] == "vector" else \
                ([float(result[1])] if data["data"]["resultType"] == "scalar" else [])
            return {"value": _aggregate(values, s.aggregate), "series": len(values)}
        first, t0 = await self._scrape(), time.monotonic()
        out: dict[str, Any] = {"value": _aggregate(first, s.aggregate), "series": len(first)}
        if s.rate_window:
            await asyncio.sleep(s.rate_window)
            second = await self._scrape()
            a, b = _aggregate(first, "sum"), _aggregate(second, "sum")
            out["rate"] = (b - a) / (time.monotonic() - t0) if a is not None and b is not None else None
            out["value"] = _aggregate(second, s.aggregate)
        return out

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None
