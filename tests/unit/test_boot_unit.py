"""`chaoskit rollback --print-unit`: the boot unit names this install's interpreter and state directory, and the
command it runs is a working `chaoskit rollback --all`."""

from __future__ import annotations

import os
import pwd
import shlex
import subprocess
import sys
from pathlib import Path

from chaoskit.app.boot_unit import rollback_unit

ROOT = Path(__file__).resolve().parents[2]


def _lines(text: str) -> dict[str, str]:
    return dict(line.split("=", 1) for line in text.splitlines() if "=" in line and not line.startswith("#"))


def test_the_unit_runs_this_interpreter_on_this_state_directory(tmp_path):
    text = rollback_unit(python="/opt/pipx/venvs/chaoskit/bin/python", state=tmp_path / "state", uid=0)
    assert _lines(text) == {
        "Description": "Revert faults left by chaoskit runs that died (crash, reboot)",
        "After": "local-fs.target network.target",
        "Type": "oneshot",
        "Environment": f"CHAOSKIT_STATE_DIR={tmp_path / 'state'}",
        "ExecStart": "/opt/pipx/venvs/chaoskit/bin/python -m chaoskit rollback --all",
        "WantedBy": "multi-user.target",
    }
    assert "/usr/local/bin" not in text and "User=" not in text


def test_a_user_other_than_root_gets_a_user_line_and_odd_paths_are_quoted(tmp_path):
    me = os.geteuid() or 65534
    text = rollback_unit(python="/home/a b/venv/bin/python", state=Path("/srv/50%/state"), uid=me)
    lines = _lines(text)
    assert lines["User"] == pwd.getpwuid(me).pw_name
    assert lines["ExecStart"] == '"/home/a b/venv/bin/python" -m chaoskit rollback --all'
    assert lines["Environment"] == "CHAOSKIT_STATE_DIR=/srv/50%%/state"
    cron = next(x for x in text.splitlines() if "crontab" in x).split("@reboot ", 1)[1]
    assert cron == "CHAOSKIT_STATE_DIR=/srv/50\\%/state '/home/a b/venv/bin/python' -m chaoskit rollback --all"


def test_a_uid_without_a_passwd_entry_is_named_by_its_number():
    uid = next(u for u in range(60000, 65000) if u not in {p.pw_uid for p in pwd.getpwall()})
    assert _lines(rollback_unit(python="/usr/bin/python3", state=Path("/s"), uid=uid))["User"] == str(uid)


def test_the_printed_unit_is_this_install_and_its_command_works(tmp_path):
    env = {**os.environ, "CHAOSKIT_STATE_DIR": str(tmp_path / "state")}
    proc = subprocess.run([sys.executable, "-m", "chaoskit", "rollback", "--print-unit"], capture_output=True,
                          text=True, env=env, cwd=ROOT, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == rollback_unit(state=tmp_path / "state")
    lines = _lines(proc.stdout)
    assert lines["ExecStart"] == f"{shlex.quote(sys.executable)} -m chaoskit rollback --all"
    # what the unit runs at boot, run here with the unit's environment: an empty state directory, nothing to do
    key, value = lines["Environment"].split("=", 1)
    run = subprocess.run(shlex.split(lines["ExecStart"]), capture_output=True, text=True, cwd=ROOT, timeout=60,
                         env={**os.environ, key: value})
    assert run.returncode == 0, run.stderr
    assert f"nothing to roll back (no unfinished ledger in {tmp_path / 'state' / 'ledgers'})" in run.stdout
