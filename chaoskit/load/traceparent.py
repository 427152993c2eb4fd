"""W3C Trace Context: read a `traceparent` (the TRACEPARENT environment variable, a request's header) and write one."""

from __future__ import annotations

import re
from collections.abc import Mapping

ENV = "TRACEPARENT"  # OpenTelemetry's environment-variable carrier: chaoskit run sets it for its life
_HEADER = re.compile(r"([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})(?:-.*)?")


def parse(value: str | None) -> tuple[int, int, int] | None:
    """(trace id, parent span id, flags) of a traceparent value; None when it is absent or invalid (version ff,
    an all-zero id, a version-00 header with more fields, upper-case hex)."""
    if not value:
        return None
    m = _HEADER.fullmatch(value.strip())
    if m is None or m.group(1) == "ff" or (m.group(1) == "00" and len(value.strip()) != 55):
        return None
    trace_id, span_id = int(m.group(2), 16), int(m.group(3), 16)
    if not trace_id or not span_id:
        return None
    return trace_id, span_id, int(m.group(4), 16)


def format_header(trace_id: int, span_id: int, sampled: bool = True) -> str:
    """A version-00 traceparent value."""
    return f"00-{trace_id:032x}-{span_id:016x}-{'01' if sampled else '00'}"


def from_env(environ: Mapping[str, str]) -> str | None:
    """The traceparent the load generator sends (version 00, sampled): the environment's TRACEPARENT, normalised;
    None (no header) when it is unset or invalid."""
    parsed = parse(environ.get(ENV))
    return format_header(parsed[0], parsed[1]) if parsed else None
