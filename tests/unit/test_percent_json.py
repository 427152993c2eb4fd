"""A Percent writes itself in JSON as it reads back: a spec dumped in JSON mode validates to the same spec."""

from __future__ import annotations

import pytest
from pydantic import BaseModel

from chaoskit.model.types import Percent
from chaoskit.units import format_percent, parse_percent


class One(BaseModel):
    share: Percent
    maybe: Percent | None = None


@pytest.mark.parametrize("text", ["0.2%", "100%", "0%", "5%", "0.0001%", "33.3333%"])
def test_a_percent_round_trips_through_json(text):
    m = One(share=text, maybe=text)
    dumped = m.model_dump(mode="json")
    assert dumped == {"share": text, "maybe": text} and One.model_validate(dumped) == m
    assert m.model_dump() == {"share": parse_percent(text), "maybe": parse_percent(text)}  # python mode: the fraction


def test_format_percent_is_parse_percents_inverse():
    assert format_percent(0.002) == "0.2%" and format_percent(1.0) == "100%"
    assert parse_percent(format_percent(0.123456)) == pytest.approx(0.123456)
