import pytest

from chaoskit.engine.states import FailureKind, RunStatus, State


def walk(st: RunStatus, *states: State) -> RunStatus:
    for s in states:
        st.to(s)
    return st


def test_happy_path_and_exit_codes():
    st = walk(RunStatus(), State.VALIDATING, State.PREFLIGHT, State.HYPOTHESIS_BEFORE, State.METHOD,
              State.ROLLBACK, State.HYPOTHESIS_AFTER, State.DONE)
    assert st.exit_code() == 0 and st.verdict == "held"
    st.deviate("p99 too high")
    assert st.exit_code() == 1 and st.verdict == "deviated"
    st.rollback_incomplete = True
    assert st.exit_code() == 5


def test_illegal_transitions_are_refused():
    st = RunStatus()
    with pytest.raises(RuntimeError):
        st.to(State.METHOD)
    walk(st, State.VALIDATING, State.PREFLIGHT, State.HYPOTHESIS_BEFORE, State.METHOD)
    with pytest.raises(RuntimeError):
        st.to(State.DONE)  # the method never ends without a rollback


@pytest.mark.parametrize("signum,code", [(2, 130), (15, 143)])
def test_interrupted(signum, code):
    st = walk(RunStatus(), State.VALIDATING, State.PREFLIGHT, State.HYPOTHESIS_BEFORE, State.METHOD,
              State.ROLLBACK)
    st.interrupt(signum)
    st.to(State.INTERRUPTED)
    assert st.exit_code() == code


def test_failures():
    st = walk(RunStatus(), State.VALIDATING, State.PREFLIGHT)
    st.fail(FailureKind.PREFLIGHT, "no netem")
    st.to(State.FAILED)
    assert st.exit_code() == 4
    st2 = walk(RunStatus(), State.VALIDATING, State.PREFLIGHT, State.HYPOTHESIS_BEFORE, State.METHOD,
               State.ROLLBACK, State.ABORTED)
    assert st2.exit_code() == 3
    with pytest.raises(RuntimeError):
        RunStatus().exit_code()


from chaoskit.engine.states import Event  # noqa: E402

E = Event


def drive(*steps, dry_run=False) -> RunStatus:
    """Feed events (and flag changes, as callables) to a fresh status; return it."""
    st = RunStatus(dry_run=dry_run)
    for step in steps:
        step(st) if callable(step) else st.on(step)
    return st


def deviate(st: RunStatus) -> None:
    st.deviate("x")


def sigint(st: RunStatus) -> None:
    st.interrupt(2)


def apply_failed(st: RunStatus) -> None:
    st.fail(FailureKind.APPLY, "apply failed")


def safeguard(st: RunStatus) -> None:
    st.aborted = "safeguard tripped"


FRONT = (E.BEGIN, E.VALIDATED, E.PREFLIGHT_OK)
METHOD = (*FRONT, E.BEFORE_CHECKED, E.METHOD_DONE, E.ROLLBACK_DONE)


@pytest.mark.parametrize("steps, kw, state, code", [
    ((*METHOD, E.AFTER_DONE), {}, State.DONE, 0),
    ((*FRONT[:-1], E.PREFLIGHT_OK), {"dry_run": True}, State.DONE, 0),
    ((E.BEGIN, E.VALIDATED, E.PREFLIGHT_FAILED), {}, State.FAILED, 4),
    ((*FRONT, deviate, E.BEFORE_CHECKED, E.ROLLBACK_DONE), {}, State.DONE, 1),  # nothing injected, no after
    ((E.BEGIN, E.VALIDATED, sigint, E.PREFLIGHT_OK), {}, State.INTERRUPTED, 130),
    ((*FRONT, sigint, E.BEFORE_CHECKED, E.ROLLBACK_DONE), {}, State.INTERRUPTED, 130),
    ((*FRONT, E.BEFORE_CHECKED, sigint, E.METHOD_DONE, E.ROLLBACK_DONE), {}, State.INTERRUPTED, 130),
    ((*FRONT, E.BEFORE_CHECKED, safeguard, E.METHOD_DONE, E.ROLLBACK_DONE), {}, State.ABORTED, 3),
    ((*FRONT, E.BEFORE_CHECKED, apply_failed, E.METHOD_DONE, E.ROLLBACK_DONE), {}, State.FAILED, 1),
    ((*FRONT, E.WATCHDOG_FAILED, E.ROLLBACK_DONE), {}, State.FAILED, 1),
    ((*METHOD, sigint, E.AFTER_DONE), {}, State.INTERRUPTED, 130),
    ((*METHOD, deviate, E.AFTER_DONE), {}, State.DONE, 1),
])
def test_the_state_machine_decides_from_events(steps, kw, state, code):
    st = drive(*steps, **kw)
    assert st.state is state and st.exit_code() == code


def test_an_engine_error_rolls_back_first_wherever_it_happens():
    st = drive(*FRONT, E.BEFORE_CHECKED)
    assert st.on(E.ENGINE_ERROR, "boom") is State.ROLLBACK
    assert st.on(E.ENGINE_ERROR, "again") is State.ROLLBACK  # during the rollback: it stays and finishes
    assert st.on(E.ROLLBACK_DONE) is State.FAILED and st.failure is FailureKind.INTERNAL
    after = drive(*METHOD)
    assert after.on(E.ENGINE_ERROR, "boom") is State.FAILED  # in the after-check: nothing left to revert
