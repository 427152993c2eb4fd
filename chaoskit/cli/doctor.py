"""`chaoskit doctor [--json] [--fix]`: the checks as a table (or JSON), what is missing and what provides it."""

from __future__ import annotations

import json
import os

import typer
from rich.markup import escape

from chaoskit.doctor import REQUIREMENTS, Check, python_info, run_checks
from chaoskit.errors import ChaoskitError, PreflightError
from chaoskit.term import Table, console

out = console()
err = console(stderr=True)


def _fail(e: ChaoskitError) -> None:
    for line in str(e).splitlines():
        err.print(f"[red]error:[/] {escape(line)}", markup=True, highlight=False, soft_wrap=True)
    raise typer.Exit(e.exit_code)


def doctor_command(as_json: bool, fix: bool) -> None:
    if as_json and fix:
        _fail(ChaoskitError("--fix prints and runs commands; ask for --json without it"))
    checks = run_checks()
    if as_json:
        print(json.dumps([c.to_json() for c in checks], indent=2))
        return
    show(checks)
    if fix:
        try:
            fix_command(checks)
        except ChaoskitError as e:
            _fail(e)


def show(checks: list[Check]) -> None:
    table = Table(title=f"chaoskit doctor — {python_info()}")
    for col in ("capability", "ok", "detail"):
        table.add_column(col)
    for c in checks:
        table.add_row(c.area, "[green]yes[/]" if c.ok else "[red]no[/]", escape(c.detail))
    out.print(table)
    missing = [c for c in checks if not c.ok and c.missing]
    if missing:
        out.print("\nmissing — what it blocks, what provides it:", highlight=False)
    said: set[str] = set()
    for c in missing:
        out.print(f"[red]✗[/] {escape(c.area)} — blocks {escape(', '.join(c.blocks))}", highlight=False,
                  soft_wrap=True)
        for rid in c.missing:
            req = REQUIREMENTS[rid]
            remedy = "see above" if rid in said else req.remedy()
            said.add(rid)
            out.print(f"    needs {escape(req.what)}: {escape(remedy)}", highlight=False, soft_wrap=True)


def fix_command(checks: list[Check]) -> None:
    """Show the commands; run them as root on an apt host; otherwise say why not (PreflightError)."""
    from chaoskit import doctor_fix

    fp = doctor_fix.plan(checks)
    commands = fp.commands()
    family = doctor_fix.FAMILIES[fp.family]
    out.print(f"\ndoctor --fix ({family} commands):" if commands else
              "\ndoctor --fix: nothing for it to install here", highlight=False)
    for argv in commands:
        out.print(f"  $ {escape(' '.join(argv))}", highlight=False, soft_wrap=True)
    if fp.manual:
        out.print("not fixed by --fix:", highlight=False)
    for line in fp.manual:
        out.print(f"  - {escape(line)}", highlight=False, soft_wrap=True)
    if os.geteuid() != 0:
        raise PreflightError("doctor --fix needs root: run the commands above as root, or `sudo chaoskit doctor "
                             "--fix`" if commands else "doctor --fix needs root (here there is nothing to install)")
    if not commands:
        return
    if fp.family != "debian":
        raise PreflightError("this host has no apt-get, and doctor --fix runs apt-get only (not dnf): run the "
                             "RHEL-family commands above yourself")
    doctor_fix.run(fp, lambda m: out.print(escape(m), highlight=False, soft_wrap=True))
    still = [c.area for c in run_checks() if not c.ok]
    out.print("[green]done[/]" + (f"; still missing: {escape(', '.join(still))}" if still else ""), highlight=False)
