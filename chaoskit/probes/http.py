"""http probe: status, latency, numeric header comparisons (X-Model-Latency) and JSON body fields."""

from __future__ import annotations

import json
import re
import time
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from pydantic import Field

from chaoskit.model.types import Url
from chaoskit.probes.base import Probe, ProbeSpecBase, RequestTarget, http_session

if TYPE_CHECKING:
    import aiohttp  # types only: http_session (probes.base) imports it where a session is made

_PATH_TOKEN = re.compile(r"([^.\[\]]+)|\[(\d+)\]")


class HttpProbeSpec(ProbeSpecBase):
    type: Literal["http"]
    url: Url = Field(pattern=r"^https?://", description="URL to request")
    method: Literal["GET", "POST", "PUT", "HEAD", "DELETE"] = "GET"
    headers: dict[str, str] = Field(default_factory=dict, description="request headers")
    body: str | dict[str, Any] | list[Any] | None = Field(None, description="request body (maps go as JSON)")
    expect_keys: ClassVar[tuple[str, ...]] = ("status", "latency_ms", "body", "headers.", "json.")

    def request_target(self) -> RequestTarget:
        return RequestTarget(self.url, self.timeout, url_path=True)


def json_path(doc: Any, path: str) -> Any:
    """Value at a dotted path with [n] indexes (`data.choices[0].text`); KeyError if absent."""
    cur = doc
    for name, index in _PATH_TOKEN.findall(path):
        if index:
            cur = cur[int(index)]
        elif isinstance(cur, dict):
            cur = cur[name]
        else:
            raise KeyError(path)
    return cur


class HttpProbe(Probe):
    type: ClassVar[str] = "http"
    summary: ClassVar[str] = "HTTP request: status, latency, headers (X-Model-Latency), JSON body fields"
    Spec = HttpProbeSpec
    spec: HttpProbeSpec

    def __init__(self, spec: HttpProbeSpec):
        super().__init__(spec)
        self._session: aiohttp.ClientSession | None = None

    async def measure(self) -> dict[str, Any]:
        s = self.spec
        if self._session is None:
            self._session = http_session(s.timeout)
        kwargs: dict[str, Any] = {"headers": s.headers}
        if isinstance(s.body, (dict, list)):
            kwargs["json"] = s.body
        elif s.body is not None:
            kwargs["data"] = s.body
        t0 = time.perf_counter()
        async with self._session.request(s.method, s.url, **kwargs) as resp:
            text = await resp.text(errors="replace")
            latency_ms = (time.perf_counter() - t0) * 1000
            out: dict[str, Any] = {"status": resp.status, "latency_ms": round(latency_ms, 3), "body": text[:4096]}
            for key, value in resp.headers.items():
                out[f"headers.{key}"] = value
        wanted_json = [k for k in s.flat_expect() if k.startswith("json.")]
        if wanted_json:
            try:
                doc = json.loads(text)
            except ValueError:
                doc = None
            for key in wanted_json:
                try:
                    out[key] = json_path(doc, key[5:])
                except (KeyError, IndexError, TypeError):
                    out[key] = None
        # header names are case-insensitive: also offer each expected header under its spelled name
        for key in s.flat_expect():
            if key.startswith("headers.") and key not in out:
                want = key[8:].lower()
                out[key] = next((v for k, v in resp.headers.items() if k.lower() == want), None)
        return out

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None
