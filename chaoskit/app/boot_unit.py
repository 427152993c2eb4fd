"""The systemd unit that replays unfinished ledgers at boot (`chaoskit rollback --print-unit`), for this install."""

from __future__ import annotations

import os
import pwd
import shlex
import sys
from pathlib import Path

from chaoskit.paths import state_dir

UNIT_NAME = "chaoskit-rollback.service"


def _word(text: str) -> str:
    """One word of a unit's command or assignment: `%` doubled (a specifier otherwise), quoted when it holds a
    space, a quote or a backslash."""
    text = text.replace("%", "%%")
    if any(c in text for c in ' \t"\\\''):
        return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'
    return text


def _cron(text: str) -> str:
    """One word of a crontab command: shell-quoted, `%` escaped (cron turns a bare one into a newline)."""
    return shlex.quote(text).replace("%", "\\%")


def rollback_command(python: str | None = None) -> list[str]:
    """`chaoskit rollback --all` as this install runs it: the interpreter that runs chaoskit now (a pipx or venv
    interpreter, not resolved: its venv is what imports chaoskit), with `-m chaoskit`."""
    return [python or sys.executable, "-m", "chaoskit", "rollback", "--all"]


def rollback_unit(python: str | None = None, state: Path | None = None, uid: int | None = None) -> str:
    """The unit's text: this interpreter, this state directory (whose ledgers it replays), and, for a user other
    than root, that user (a ledger is reverted by whoever wrote it)."""
    uid = os.geteuid() if uid is None else uid
    state = (state or state_dir()).absolute()
    command = " ".join(_word(w) for w in rollback_command(python))
    try:
        name = pwd.getpwuid(uid).pw_name
    except KeyError:  # a UID with no passwd entry (a container run with --user N): systemd takes the number
        name = str(uid)
    user = f"User={_word(name)}\n" if uid != 0 else ""
    cron = " ".join(_cron(w) for w in [f"CHAOSKIT_STATE_DIR={state}", *rollback_command(python)])
    return (f"# /etc/systemd/system/{UNIT_NAME}, then: systemctl daemon-reload && systemctl enable {UNIT_NAME}\n"
            f"# without systemd, in {name}'s crontab: @reboot {cron}\n"
            "[Unit]\n"
            "Description=Revert faults left by chaoskit runs that died (crash, reboot)\n"
            "After=local-fs.target network.target\n"
            "[Service]\n"
            "Type=oneshot\n"
            f"{user}"
            f"Environment={_word(f'CHAOSKIT_STATE_DIR={state}')}\n"
            f"ExecStart={command}\n"
            "[Install]\n"
            "WantedBy=multi-user.target\n")
