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
