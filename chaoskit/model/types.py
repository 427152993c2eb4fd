"""Annotated pydantic field types for the experiment file (durations, percents, tolerances, rules)."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, PlainSerializer, PlainValidator, WithJsonSchema

from chaoskit.model.tolerance import Rule, Tolerance, parse_rule, parse_tolerance
from chaoskit.units import parse_duration, parse_percent


class StrictModel(BaseModel):
    """Base of every spec model: unknown keys are errors."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True, frozen=True)


Port = Annotated[int, Field(gt=0, lt=65536, description="TCP/UDP port 1..65535")]
Duration = Annotated[
    float,
    BeforeValidator(parse_duration),
    WithJsonSchema({"type": ["string", "number"], "pattern": r"^\d+(\.\d+)?(us|ms|s|m|h)?$",
                    "description": "duration like '15ms', '2s', '5m' (bare numbers are seconds)"}),
]
Percent = Annotated[
    float,
    BeforeValidator(parse_percent),
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
