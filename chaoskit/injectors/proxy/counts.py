"""What one fault of an L7 proxy (llm.proxy, mcp.proxy) did so far, as its /chaoskit/stats reports it."""

from __future__ import annotations

from typing import NamedTuple

CountsJson = dict[str, str | float | None]  # FaultCounts.to_json


class FaultCounts(NamedTuple):
    """What one fault did so far: its type and share; the requests its match selected, those its share drew, those
    its effect really happened on, and that as a share of the matched (None: none matched yet)."""

    type: str
    share: float
    matched: int
    selected: int
    applied: int
    applied_share: float | None

    def to_json(self) -> CountsJson:
        return dict(self._asdict())  # the fields in their order
