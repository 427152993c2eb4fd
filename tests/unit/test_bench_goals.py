"""bench/goals.py, the goals every bench judges its RESULT line by: limits set for a run, nan and a missing part."""

from __future__ import annotations

import sys

import pytest

from tests.conftest import ROOT

sys.path.insert(0, str(ROOT / "bench"))
from goals import Goal, Goals  # noqa: E402


def goals(argv: list[str] | None = None, env: dict[str, str] | None = None) -> Goals:
    return Goals(Goal("ms", "<=", 100), Goal("ratio", ">=", 0.95), argv=argv or ["bench"], env=env or {})


def test_each_goal_is_judged_in_its_direction(capsys):
    assert goals().result({"ms": "100.0", "ratio": 0.95}) == 0
    assert capsys.readouterr().out.splitlines()[-1] == "RESULT ms=100.0 ratio=0.95 goal_met=True"
    assert goals().result({"ms": "100.1", "ratio": 0.949}) == 1
    assert capsys.readouterr().out.splitlines()[-1] == "RESULT ms=100.1 ratio=0.949 goal_met=False missed=ms,ratio"


def test_nan_is_a_miss_and_a_part_left_out_is_unjudged(capsys):
    assert goals().result({"ms": "nan"}) == 1
    assert capsys.readouterr().out.splitlines()[-1] == "RESULT ms=nan goal_met=False missed=ms unjudged=ratio"


def test_a_run_that_judged_nothing_is_not_met(capsys):
    assert goals().result({"other": 1}) == 1
    assert capsys.readouterr().out.splitlines()[-1] == "RESULT other=1 goal_met=False unjudged=ms,ratio"


def test_a_limit_set_for_a_run_flag_over_environment():
    argv = ["bench", "--runs", "3", "--goal", "ms=5", "--goal=ratio=2"]
    g = goals(argv, {"BENCH_GOALS": "ms=1 ratio=0.5"})
    assert (g.goals["ms"].limit, g.goals["ratio"].limit) == (5, 2)
    assert argv == ["bench", "--runs", "3"]  # left for the bench's own arguments
    assert goals(env={"BENCH_GOALS": "ms=1,ratio=0.5"}).goals["ratio"].limit == 0.5


@pytest.mark.parametrize("argv", [["b", "--goal", "nosuch=1"], ["b", "--goal", "ms"], ["b", "--goal", "ms=x"],
                                  ["b", "--goal"]])
def test_a_goal_that_is_not_one_is_exit_2(argv):
    with pytest.raises(SystemExit) as e:
        goals(argv)
    assert e.value.code == 2


def test_a_yes_no_key_is_judged_as_1_or_0(capsys):
    g = Goals(Goal("clean", ">=", 1), argv=["bench"], env={})
    assert g.result({"clean": True}) == 0 and g.result({"clean": "True"}) == 0
    assert g.result({"clean": "False"}) == 1 and g.result({"clean": "no"}) == 1
