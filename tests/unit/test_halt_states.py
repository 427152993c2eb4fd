"""A halt lever through the run state machine: before anything is applied the run is refused (exit 4), from the
before-check on it is aborted after its rollback (exit 3, `halted: WHY`); Runner.halt stops a run's method; how
often a run looks at the levers."""

from __future__ import annotations

import pytest

from chaoskit.engine.safeguards import halt_interval
from chaoskit.engine.states import Event, RunStatus, State
from chaoskit.experiment.models import Experiment

WHY = "halted: game day over"


def started() -> RunStatus:
    st = RunStatus()
    st.on(Event.BEGIN)
    st.on(Event.VALIDATED)
    return st


def test_halted_during_preflight_is_refused_like_a_run_started_while_halted():
    st = started()
    assert st.halt(WHY) and not st.halt("halted: again")  # the first lever's reason stays
    assert st.on(Event.PREFLIGHT_OK) is State.FAILED
    assert (st.exit_code(), st.reason) == (4, WHY)


@pytest.mark.parametrize("where", ["before", "method", "rollback", "after"])
def test_halted_from_the_before_check_on_aborts_after_the_rollback(where):
    st = started()
    st.on(Event.PREFLIGHT_OK)
    if where == "before":
        st.halt(WHY)
    assert st.on(Event.BEFORE_CHECKED) is (State.ROLLBACK if where == "before" else State.METHOD)
    if where == "method":
        st.halt(WHY)
    if where != "before":
        st.on(Event.METHOD_DONE)
    if where == "rollback":
        st.halt(WHY)
    after = st.on(Event.ROLLBACK_DONE)
    if where == "after":
        assert after is State.HYPOTHESIS_AFTER and not st.stopped
        st.halt(WHY)
        assert st.stopped
        st.on(Event.AFTER_DONE)
    assert (st.state, st.exit_code(), st.reason, st.verdict) == (State.ABORTED, 3, WHY, "aborted")


def test_a_safeguard_that_tripped_first_keeps_its_reason():
    st = started()
    st.on(Event.PREFLIGHT_OK)
    st.on(Event.BEFORE_CHECKED)
    st.aborted = "safeguard p: error_rate > 0.5"
    st.halt(WHY)
    st.on(Event.METHOD_DONE)
    assert st.on(Event.ROLLBACK_DONE) is State.ABORTED and st.reason == "safeguard p: error_rate > 0.5"


def experiment(**extra) -> Experiment:
    return Experiment.model_validate({
        "apiVersion": "chaoskit/v1", "kind": "Experiment", "metadata": {"name": "x"},
        "steadyState": {"probes": [{"name": "t", "type": "command", "argv": ["true"]}], **extra.pop("ss", {})},
        "method": [{"pause": 1}], **extra})


def test_the_levers_are_looked_at_each_safeguard_interval_within_a_quarter_and_one_second():
    assert halt_interval(experiment()) == 1.0  # no safeguard, no during: still every second
    assert halt_interval(experiment(ss={"during": {"every": "0.5s"}})) == 0.5
    guard = {"probe": "t", "abort_when": "exit_code != 0", "every": "0.1s"}
    assert halt_interval(experiment(safeguards=[guard])) == 0.25
    assert halt_interval(experiment(ss={"during": {"every": "5s"}})) == 1.0


def test_a_lever_file_that_cannot_be_read_still_halts(tmp_path, monkeypatch):
    from chaoskit.app.halt import new_lever, pull_host_lever, read_host_lever, release_host_lever

    monkeypatch.setenv("CHAOSKIT_STATE_DIR", str(tmp_path))
    assert read_host_lever() is None and release_host_lever() is False
    pulled = new_lever("  two\nlines ")
    assert pull_host_lever(pulled) == tmp_path / "halt.json"
    lever = read_host_lever()
    assert (lever.by, lever.at, lever.reason) == (pulled.by, pulled.at, "two lines") and "@" in lever.by
    (tmp_path / "halt.json").write_text("{torn")
    torn = read_host_lever()
    assert torn is not None and "unreadable" in torn.reason and torn.when() == "an unknown time"
    assert release_host_lever() is True and read_host_lever() is None


PAUSED = """\
apiVersion: chaoskit/v1
kind: Experiment
metadata: {name: paused}
steadyState:
  probes: [{name: t, type: command, argv: ["true"]}]
method:
  - pause: 30s
"""


def test_runner_halt_stops_the_method_and_ends_the_run_aborted_once(tmp_path):
    import asyncio

    from chaoskit.engine.journal import Journal, read_journal
    from chaoskit.engine.runner import Runner, RunOptions
    from chaoskit.experiment.loader import load_experiment
    from chaoskit.model.events import SafeguardTripped

    f = tmp_path / "e.yaml"
    f.write_text(PAUSED)
    runner = Runner(load_experiment(f).experiment, Journal(tmp_path / "journal.jsonl"),
                    RunOptions(ledger_dir=tmp_path, use_watchdog=False))

    async def main() -> None:
        run = asyncio.create_task(runner.execute())
        while runner.status.state is not State.METHOD:
            await asyncio.sleep(0.01)
        runner.halt(WHY, "by op@host at noon")
        runner.halt("halted: again")  # the first lever's reason stays, journaled once
        await asyncio.wait_for(run, 10)

    asyncio.run(main())
    assert (runner.status.state, runner.result.exit_code, runner.status.reason) == (State.ABORTED, 3, WHY)
    trips = [e for e in read_journal(tmp_path / "journal.jsonl") if isinstance(e, SafeguardTripped)]
    assert [(e.probe, e.reason) for e in trips] == [("halt", f"{WHY} (pulled by op@host at noon)")]
    runner.halt(WHY)  # a finished run ignores a lever
    assert runner.status.state is State.ABORTED
