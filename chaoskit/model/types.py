"""Annotated pydantic field types for the experiment file (durations, percents, tolerances, rules)."""

from __future__ import annotations

import re
from typing import Annotated, Any
from urllib.parse import urlsplit

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PlainSerializer,
    PlainValidator,
    ValidationInfo,
    WithJsonSchema,
)

from chaoskit.model.tolerance import Rule, Tolerance, parse_rule, parse_tolerance
from chaoskit.units import bare_duration, format_percent, parse_duration, parse_percent

WRITTEN = "chaoskit.written"  # validation context key: the data is what a person wrote (a file, a CLI option)


def written() -> dict[str, Any]:
    """The validation context of data a person wrote (an experiment file and what it includes, a CLI option):
    there a duration needs its unit. Python code and chaoskit's own JSON validate without it (bare numbers are
    seconds)."""
    return {WRITTEN: True}


class StrictModel(BaseModel):
    """Base of every spec model: unknown keys are errors."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True, frozen=True, defer_build=True)


Port = Annotated[int, Field(gt=0, lt=65536, description="TCP/UDP port 1..65535")]
_RUN_TIME = re.compile(r"\{[A-Za-z_][\w\-]*(?:\[\d+\])?(?:\.[A-Za-z_][\w\-]*(?:\[\d+\])?)*\}")  # a placeholder


def check_url(url: str) -> str:
    """An http(s) URL whose host:port can be read: a port, where given, is a number 0..65535 or a placeholder
    resolved at run time (`{target.gateway_port}`); ValueError naming the port otherwise (a URL the loader let
    through would otherwise fail later, in whatever reads its port)."""
    rest = url.split("://", 1)[-1]
    hostport = re.split(r"[/?#]", rest, maxsplit=1)[0].rpartition("@")[2]
    host_end = hostport.rpartition("]")[2] if hostport.startswith("[") else hostport
    port = host_end.partition(":")[2] if "]" in hostport or not hostport.startswith("[") else ""
    if _RUN_TIME.fullmatch(port):
        return url
    try:
        urlsplit(url).port  # noqa: B018 - the check is whether it can be read
    except ValueError as e:
        if port and not port.isdigit():
            raise ValueError(f"{url!r}: the port {port!r} is not a number (a placeholder is written {{NAME}}, "
                             "{var.NAME} or {target.FACT})") from None
        raise ValueError(f"{url!r}: {e}") from None
    return url


Url = Annotated[str, AfterValidator(check_url)]  # an http(s) URL field's checks beyond its pattern


def _duration(value: Any, info: ValidationInfo) -> float:
    seconds = parse_duration(value)
    if info.context and info.context.get(WRITTEN) and (number := bare_duration(value)) is not None:
        raise ValueError(f"a bare number is ambiguous: write {number}ms or {number}s")
    return seconds


Duration = Annotated[
    float,
    BeforeValidator(_duration),
    WithJsonSchema({"type": ["string", "number"], "pattern": r"^\s*(\d+(\.\d+)?\s*(us|µs|ms|s|m|h)|0+(\.0+)?)\s*$",
                    "minimum": 0, "maximum": 0,  # the one bare number allowed is 0
                    "description": "duration with its unit: '250us', '15ms', '2s', '5m', '1h' (a bare number "
                                   "other than 0 is refused)"}),
]
Percent = Annotated[
    float,
    BeforeValidator(parse_percent),
    # in JSON it writes itself as it reads back ('0.2%'): a fraction dumped bare (0.002) would read as 0.002%
    PlainSerializer(format_percent, return_type=str, when_used="json"),
    WithJsonSchema({"type": ["string", "number"], "pattern": r"^\d+(\.\d+)?%$",
                    "description": "percentage like '0.2%' (bare numbers are percent)"}),
]


def _tol(value: Any) -> Tolerance:
    return parse_tolerance(value)


ToleranceSpec = Annotated[
    Tolerance,
    PlainValidator(_tol),
    PlainSerializer(str),
    WithJsonSchema({"description": "tolerance: '< 950', '>= 0.99', '100..200', '== 0', '~ regex', "
                                   "[low, high], a plain value for equality, or a comparison with the value "
                                   "measured in the before phase: '< 3x baseline', '<= baseline + 0.01', "
                                   "'< baseline * 1.5 + 20'"}),
]
RuleSpec = Annotated[
    Rule,
    PlainValidator(parse_rule),
    PlainSerializer(str),
    WithJsonSchema({"type": "string", "description": "rule 'metric op value' with a fixed value, e.g. "
                                                     "'error_rate > 0.5' (no baseline)"}),
]
