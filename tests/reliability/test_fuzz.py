"""Fuzzing the user's inputs: mutated experiment files and random CLI arguments never crash chaoskit (no
traceback: exit 0 or 2) and an invalid file applies nothing. bench/fuzz.py runs 10 000 documents."""

from __future__ import annotations

import random

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from chaoskit.cli.main import app
from tests.helpers.fuzzdocs import SEEDS, check_document, mutate


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seed=st.integers(0, 2**32 - 1), which=st.integers(0, len(SEEDS) - 1))
def test_mutated_documents_are_valid_or_a_clear_error(tmp_path, seed, which):
    f = tmp_path / "fuzz.yaml"
    f.write_text(mutate(SEEDS[which].read_text(), random.Random(seed)))
    assert check_document(f) in ("ok", "invalid")


ARGS = st.lists(st.sampled_from(["run", "validate", "--var", "x=1", "=", "--dry-run", "--junit", "--out", "--all",
                                 "--ledger", "/nonexistent", "rollback", "schema", "list", "version", "--json",
                                 "-x", "--var=a", "a b", "", "--plain", "--live"]) | st.text(max_size=8),
                max_size=5)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(args=ARGS)
def test_cli_arguments_never_crash(tmp_path, monkeypatch, args):
    monkeypatch.setenv("CHAOSKIT_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.chdir(tmp_path)
    if "run" in args and "--dry-run" not in args:
        args = [*args, "--dry-run"]  # a valid file must not be applied by a fuzz test
    result = CliRunner().invoke(app, args)
    assert result.exception is None or isinstance(result.exception, SystemExit), result.output
    assert result.exit_code in (0, 2, 4), (args, result.exit_code, result.output)
    assert not list((tmp_path / "state" / "ledgers").glob("*.jsonl")) if (tmp_path / "state" / "ledgers").exists() else True


def test_an_invalid_file_run_for_real_applies_nothing(tmp_path, state_dir, sleeper):
    from tests.conftest import chaoskit, ledgers, proc_state

    f = tmp_path / "bad.yaml"
    f.write_text(f"apiVersion: chaoskit/v1\nkind: Experiment\nmetadata: {{name: bad}}\nsteadyState:\n  probes:\n"
                 f"    - {{name: p, type: command, argv: [\"true\"]}}\nmethod:\n"
                 f"  - inject: {{type: process.signal, pid: {sleeper.pid}, signal: SIGWHAT}}\n")
    run = chaoskit("run", str(f), state=state_dir)
    out, err = run.communicate(timeout=60)
    assert run.returncode == 2 and "Traceback" not in out + err and "signal must be one of" in err
    assert proc_state(sleeper.pid) == "S" and not ledgers(state_dir)


def test_rollback_never_writes_to_a_file_that_is_not_a_ledger(tmp_path, state_dir):
    """bench/fuzz.py found it: `rollback --ledger experiment.yaml` appended a `closed` line to the experiment."""
    from tests.conftest import ROOT, chaoskit

    f = tmp_path / "drop.yaml"
    f.write_bytes((ROOT / "experiments/network/drop.yaml").read_bytes())
    rb = chaoskit("rollback", "--ledger", str(f), state=state_dir)
    out, err = rb.communicate(timeout=60)
    assert rb.returncode == 2 and "not a chaoskit ledger" in err
    assert f.read_bytes() == (ROOT / "experiments/network/drop.yaml").read_bytes()
