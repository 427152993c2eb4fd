"""exec through `chaoskit run` with real commands (touch, test, rm, sh): the revert command removes what the apply
command made after a normal end, after a failed apply, after a SIGKILL of the run (the watchdog runs it), with
`chaoskit rollback --all` after the run and its watchdog were both killed, and after an apply the SIGKILL cut
short; preflight and validation exit codes."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

from chaoskit.injectors.exec.fault import TOKEN_VAR
from tests.conftest import chaoskit, ledger_ops, ledgers, wait_for, write

EXPERIMENT = """\
apiVersion: chaoskit/v1
kind: Experiment
metadata: {{name: exec-fault}}
steadyState:
  probes: [{{name: ok, type: command, argv: ["true"]}}]
  during: {{every: 200ms}}
  after: {{within: 5s, every: 100ms}}
method:
  - inject:
      type: exec
      apply: {apply}
      revert: [rm, -f, flag, late]
      observe: [test, -e, flag]
      cwd: "{{dir}}"
      timeout: {timeout}
    duration: {duration}
"""


def experiment(tmp_path: Path, apply: str = "[touch, flag]", duration: str = "60s", timeout: str = "10s") -> Path:
    return write(tmp_path / "exp.yaml", EXPERIMENT.format(apply=apply, duration=duration, timeout=timeout))


def run(tmp_path: Path, state: Path, exp: Path, *more: str):
    # from another directory: the relative paths (flag, late) are the fault's cwd's, recorded in the ledger
    return chaoskit("run", str(exp), "--var", f"dir={tmp_path}", "--out", str(tmp_path / "out"), *more,
                    state=state, cwd="/")


def journal(tmp_path: Path) -> list[dict]:
    return [json.loads(line) for line in (tmp_path / "out" / "journal.jsonl").read_text().splitlines()]


def wait_ledger(state: Path, op: str, timeout: float = 15) -> Path:
    wait_for(lambda: any(op in ledger_ops(p) for p in ledgers(state)), timeout)
    return ledgers(state)[0]


def token_holders(token: str) -> list[int]:
    marker, out = f"{TOKEN_VAR}={token}".encode(), []
    for p in Path("/proc").iterdir():
        try:
            if p.name.isdigit() and marker in (p / "environ").read_bytes().split(b"\0"):
                out.append(int(p.name))
        except OSError:
            pass
    return out


def test_apply_observe_revert(tmp_path, state_dir):
    proc = run(tmp_path, state_dir, experiment(tmp_path, duration="600ms"))
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, out + err
    assert not (tmp_path / "flag").exists() and ledgers(state_dir) == []
    events = journal(tmp_path)
    plan = next(e for e in events if e["event"] == "plan")["steps"][0]
    assert plan["type"] == "exec"
    assert any(line.endswith(f"/touch flag in {tmp_path} (limit 10s each command)") for line in plan["changes"])
    assert any(line.startswith("revert: run ") and "/rm -f flag late" in line for line in plan["changes"])
    observed = {e["when"]: e["details"] for e in events if e["event"] == "fault_observed"}
    assert observed["applied"]["in_effect"] is True and observed["before_revert"]["in_effect"] is True
    assert [e["event"] for e in events].count("fault_reverted") == 1


def test_a_failed_apply_fails_the_step_and_is_still_reverted(tmp_path, state_dir):
    # half its work done (flag made), then an error: the message carries the end of stderr, the revert runs
    apply = '[sh, -c, "touch flag; echo draining replica-1 >&2; echo 409 conflict from the router >&2; exit 7"]'
    proc = run(tmp_path, state_dir, experiment(tmp_path, apply=apply))
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 1, out + err
    assert "exec: apply failed: CommandFailed: apply command" in out
    assert "exited 7 after" in out and "stderr: draining replica-1 | 409 conflict from the router" in out
    assert not (tmp_path / "flag").exists() and ledgers(state_dir) == []
    events = journal(tmp_path)
    assert [e["event"] for e in events].count("fault_reverted") == 1
    assert next(e for e in events if e["event"] == "end")["verdict"] == "failed"


def test_an_apply_over_its_timeout_is_killed_and_reverted(tmp_path, state_dir):
    apply = '[sh, -c, "touch flag; sleep 30; touch late"]'
    t0 = time.monotonic()
    proc = run(tmp_path, state_dir, experiment(tmp_path, apply=apply, timeout="500ms"))
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 1, out + err
    assert "timed out after 0.5s (its process group was killed)" in out
    assert time.monotonic() - t0 < 15
    assert not (tmp_path / "flag").exists() and not (tmp_path / "late").exists()


def test_sigkill_of_the_run_the_watchdog_runs_the_revert(tmp_path, state_dir):
    proc = run(tmp_path, state_dir, experiment(tmp_path))
    ledger = wait_ledger(state_dir, "applied")
    assert (tmp_path / "flag").exists()
    intent = next(json.loads(line) for line in ledger.read_text().splitlines() if '"op":"intent"' in line)
    assert intent["record"]["revert"][1:] == ["-f", "flag", "late"] and intent["record"]["cwd"] == str(tmp_path)
    proc.kill()
    proc.communicate()
    took = wait_for(lambda: not (tmp_path / "flag").exists(), timeout=10)
    assert took < 5, f"watchdog took {took:.2f}s"
    wait_for(lambda: ledger_ops(ledger)[-1] == "closed", timeout=5)
    assert "rolling back" in Path(str(ledger) + ".watchdog.log").read_text()


def test_rollback_command_runs_the_revert_after_run_and_watchdog_were_killed(tmp_path, state_dir):
    proc = run(tmp_path, state_dir, experiment(tmp_path))
    ledger = wait_ledger(state_dir, "applied")
    wd = next(json.loads(line)["proc"]["pid"] for line in ledger.read_text().splitlines()
              if json.loads(line)["op"] == "watchdog")
    proc.send_signal(signal.SIGSTOP)  # frozen first, so it cannot replace the watchdog killed next
    os.kill(wd, signal.SIGKILL)
    proc.kill()
    proc.communicate()
    time.sleep(0.5)
    assert (tmp_path / "flag").exists(), "nothing should have reverted yet"
    rb = chaoskit("rollback", "--all", state=state_dir, cwd="/")
    out, err = rb.communicate(timeout=30)
    assert rb.returncode == 0, out + err
    assert "reverted #1 exec" in out
    assert not (tmp_path / "flag").exists() and ledger_ops(ledger)[-1] == "closed"


def test_an_apply_cut_short_by_sigkill_is_stopped_before_its_revert(tmp_path, state_dir):
    # killed mid-apply: only the intent is in the ledger; the apply command (its own session) outlives the run,
    # so the watchdog kills it by its token first, then reverts: nothing is left that could still make `late`
    apply = '[sh, -c, "touch flag; sleep 30; touch late"]'
    proc = run(tmp_path, state_dir, experiment(tmp_path, apply=apply))
    ledger = wait_ledger(state_dir, "intent")
    wait_for(lambda: (tmp_path / "flag").exists(), timeout=10)
    token = next(json.loads(line) for line in ledger.read_text().splitlines() if '"op":"intent"' in line)["record"][
        "token"]
    assert token_holders(token) and "applied" not in ledger_ops(ledger)
    proc.kill()
    proc.communicate()
    wait_for(lambda: ledger_ops(ledger)[-1] == "closed", timeout=10)
    assert token_holders(token) == [], "the apply command outlived its revert"
    assert not (tmp_path / "flag").exists() and not (tmp_path / "late").exists()


def test_a_revert_observe_still_sees_is_a_failed_rollback(tmp_path, state_dir):
    exp = experiment(tmp_path, duration="300ms")
    exp.write_text(exp.read_text().replace("revert: [rm, -f, flag, late]", "revert: [rm, -f, late]"))
    proc = run(tmp_path, state_dir, exp)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 5, out + err
    assert "still in effect after revert" in out and len(ledgers(state_dir)) == 1
    (tmp_path / "flag").unlink()  # the operator undoes it by hand; rollback then finds it gone
    rb = chaoskit("rollback", "--all", state=state_dir)
    rb_out, rb_err = rb.communicate(timeout=30)
    assert rb.returncode == 0, rb_out + rb_err
    assert ledger_ops(ledgers(state_dir)[0])[-1] == "closed"


def test_preflight_and_validation_exit_codes(tmp_path, state_dir):
    missing = run(tmp_path, state_dir, experiment(tmp_path, apply="[chaoskit-no-such-drain, replica-1]"))
    out, err = missing.communicate(timeout=60)
    assert missing.returncode == 4, out + err
    assert "exec: apply: program 'chaoskit-no-such-drain' not found on PATH" in out + err
    bad = run(tmp_path, state_dir, experiment(tmp_path, apply='"touch flag"'))
    out, err = bad.communicate(timeout=60)
    assert bad.returncode == 2, out + err
    assert "exp.yaml:11:" in out + err and "give a list of program and arguments" in out + err
    assert ledgers(state_dir) == [] and not (tmp_path / "flag").exists()
