"""kv.notify: lose, delay or duplicate the done notifications of a disaggregated deployment's KV transfers (and,
with `corrupt`, alter the KV bytes of a share of transfers): an L7 proxy on the KV side channel, as llm.proxy is
one on the token stream.

It intercepts the decode server's KV port in its network namespace (`intercept: {port, target}`, like the
proxies' transparent mode): each transfer's connection goes through chaoskit/injectors/kv_notify/server.py, which
passes bootstrap, transfer and abort frames and does its fault to the done notification alone. A dropped
notification leaves the transfer looking in progress to the decode server (its connection stays open) until
the fault is reverted. Counted (notifications seen, dropped, delayed, duplicated) and ledgered like every proxy.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any, ClassVar, Literal

from pydantic import Field, model_validator

from chaoskit.injectors.proxy.fault import ProxyHelper, ProxyRecord, check_intercept, intercept_listen
from chaoskit.injectors.proxy.intercept import Intercept
from chaoskit.model.types import Duration, Percent, StrictModel


class KvNotifySpec(StrictModel):
    type: Literal["kv.notify"]
    intercept: Intercept = Field(description="the decode server's KV port and the namespace it listens in (its "
                                             "transfers' connections are redirected through the proxy)")
    listen: str = Field("", description=":PORT the proxy listens on in the namespace (default: a free one)")
    drop: Percent = Field(0.0, description="share of done notifications lost (the transfer then never ends, "
                                           "as far as the decode server can tell)")
    delay: Duration = Field(0.0, ge=0, description="added before each done notification that is not dropped")
    duplicate: Percent = Field(0.0, description="share of done notifications sent twice")
    corrupt: Percent = Field(0.0, description="share of transfers whose KV bytes are altered on the way (every "
                                              "byte of their pieces inverted; the frames and the notification "
                                              "intact)")

    @model_validator(mode="before")
    @classmethod
    def _listen(cls, data: Any) -> Any:
        return intercept_listen(data)

    @model_validator(mode="after")
    def _something(self) -> KvNotifySpec:
        if not (self.drop or self.delay or self.duplicate or self.corrupt):
            raise ValueError("give at least one of drop, delay, duplicate, corrupt")
        if self.intercept.target.kubernetes is not None:
            raise ValueError("intercept.target: a local network namespace (netns or pid); not kubernetes")
        check_intercept(self)
        return self

    # what the proxies' shared code asks of a spec: kv.notify has no upstream and no TLS
    @property
    def upstream(self) -> None:
        return None

    @property
    def upstream_tls(self) -> None:
        return None

    @property
    def listen_tls(self) -> None:
        return None


class KvNotifyRecord(ProxyRecord):
    """kv.notify's record: a proxy's, and the file of the helper's counts (JSON), named after its token: revert
    removes it, so only a file of that name reads back."""

    stats: str | None = None

    @model_validator(mode="after")
    def _own_stats(self) -> KvNotifyRecord:
        if self.stats is not None and Path(self.stats).name != f"{self.token}.json":
            raise ValueError(f"{self.stats} is not the stats file of helper {self.token}")
        return self


class KvNotify(ProxyHelper[KvNotifyRecord]):
    type: ClassVar[str] = "kv.notify"
    summary: ClassVar[str] = ("lose, delay or duplicate the KV transfers' done notifications of a disaggregated deployment, "
                              "or corrupt the KV bytes they carry")
    server: ClassVar[str] = "chaoskit.injectors.kv_notify.server"
    what: ClassVar[str] = "KV notification proxy"
    token_prefix: ClassVar[str] = "chaoskit-kvnotify-"
    executors: ClassVar[frozenset[str]] = frozenset({"local"})
    target_field: ClassVar[str | None] = None
    Spec = KvNotifySpec
    spec: KvNotifySpec
    Record = KvNotifyRecord
    _stats: str | None = None  # the record's stats file, for config() at apply

    def effects(self) -> str:
        s = self.spec
        parts = [f"{what} {share * 100:g}%" for what, share in (("drop", s.drop), ("duplicate", s.duplicate)) if share]
        if s.delay:
            parts.append(f"delay {s.delay:g}s")
        notes = f"on the done notifications: {', '.join(parts)}" if parts else ""
        if s.corrupt:
            notes += ("; " if notes else "") + f"the KV bytes of {s.corrupt * 100:g}% of transfers altered"
        return notes + " (other frames pass)"

    def plan(self) -> list[str]:
        where, revert = self.intercept_plan()
        return [f"start a {self.what}{where} {self.effects()}; {revert}"]

    def prepare(self) -> KvNotifyRecord:
        rec = super().prepare()  # no upstream: each connection goes to its original destination
        return rec.model_copy(update={"stats": str(Path(tempfile.gettempdir()) / f"{rec.token}.json")})

    def config(self) -> Any:
        s = self.spec
        return {"drop": s.drop, "delay": s.delay, "duplicate": s.duplicate, "corrupt": s.corrupt, "stats": self._stats}

    def apply(self, record: KvNotifyRecord) -> KvNotifyRecord:
        self._stats = record.stats
        return super().apply(record)

    @classmethod
    def revert_many(cls, records: list[KvNotifyRecord]) -> None:
        super().revert_many(records)
        for r in records:
            if r.stats:
                Path(r.stats).unlink(missing_ok=True)

    @classmethod
    def observe_details(cls, record: KvNotifyRecord) -> dict[str, Any]:
        """The helper's counts: connections, notifications seen, dropped, delayed, duplicated."""
        out: dict[str, Any] = {"in_effect": cls.observe(record)}
        stats = record.stats
        try:
            out |= json.loads(Path(stats).read_text()) if stats else {}
        except (OSError, ValueError):
            pass
        return out

