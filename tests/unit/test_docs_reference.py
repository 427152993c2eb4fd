"""The reference pages (docs/reference/) are what scripts/gen_reference.py makes of the code now: regenerated into
a temp dir, every committed page must match byte for byte (and the nav block of mkdocs.yml), so the reference
cannot drift from the models, the CLI or the exit codes. Plus checks made from the code directly, not through
the generator: every injector, probe, command, option and exit code is on its page."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import typer

from chaoskit import errors
from chaoskit.injectors import INJECTORS
from chaoskit.probes import PROBES

ROOT = Path(__file__).resolve().parents[2]
REF = ROOT / "docs" / "reference"


@pytest.fixture(scope="module")
def generated(tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("reference")
    shutil.copy(ROOT / "mkdocs.yml", tmp / "mkdocs.yml")
    env = {**os.environ, "COLUMNS": "37"}  # a narrow terminal must not change a page
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "gen_reference.py"), "--out", str(tmp / "reference"),
                           "--mkdocs", str(tmp / "mkdocs.yml")], capture_output=True, text=True, env=env, cwd=tmp,
                          timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return tmp


def _pages(d: Path) -> dict[str, str]:
    return {p.relative_to(d).as_posix(): p.read_text() for p in sorted(d.rglob("*.md"))}


def test_committed_reference_matches_the_code(generated):
    want, have = _pages(generated / "reference"), _pages(REF)
    missing = sorted(set(want) - set(have))
    extra = sorted(set(have) - set(want))
    stale = sorted(p for p in set(want) & set(have) if want[p] != have[p])
    problems = ([f"docs/reference/{p} is missing" for p in missing]
                + [f"docs/reference/{p} is no longer generated (remove it)" for p in extra]
                + [f"docs/reference/{p} is stale" for p in stale])
    assert not problems, "; ".join(problems) + ": run `make docs` and commit docs/reference/ and mkdocs.yml"


def test_mkdocs_nav_lists_the_generated_pages(generated):
    assert (generated / "mkdocs.yml").read_text() == (ROOT / "mkdocs.yml").read_text(), (
        "mkdocs.yml's generated nav block is stale: run `make docs` and commit mkdocs.yml")


def test_the_generator_is_deterministic(generated, tmp_path):
    shutil.copy(ROOT / "mkdocs.yml", tmp_path / "mkdocs.yml")
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "gen_reference.py"), "--out", str(tmp_path / "r"),
                           "--mkdocs", str(tmp_path / "mkdocs.yml")], capture_output=True, text=True,
                          env={**os.environ, "COLUMNS": "250"}, cwd=ROOT, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert _pages(tmp_path / "r") == _pages(generated / "reference")
    for text in _pages(tmp_path / "r").values():
        assert str(ROOT) not in text and str(Path.home()) not in text and str(tmp_path) not in text


def test_every_injector_and_probe_has_its_fields_on_its_page():
    for kind, classes in (("injectors", INJECTORS), ("probes", PROBES)):
        for cls in classes:
            page = REF / kind / f"{cls.type}.md"
            assert page.is_file(), f"{page.relative_to(ROOT)} missing: run `make docs`"
            text = page.read_text()
            assert f"# `{cls.type}`" in text
            for name, field in cls.Spec.model_fields.items():
                shown = field.alias or name
                if shown == "type" or (kind == "probes" and name in ("name", "timeout", "phases", "expect")):
                    continue
                assert f"| `{shown}` |" in text, f"{page.relative_to(ROOT)}: field {shown} missing"
            assert "```yaml\n" in text  # the example (validated by test_docs_examples.py)


def test_every_command_and_option_is_on_the_cli_page():
    text = (REF / "cli.md").read_text()
    root = typer.main.get_command(__import__("chaoskit.cli.main", fromlist=["app"]).app)

    def walk(cmd, path):
        for name, sub in cmd.commands.items():
            full = f"{path} {name}"
            assert f"`{full}`" in text, f"reference/cli.md lacks {full}: run `make docs`"
            for p in sub.params:
                for opt in p.opts:
                    if opt.startswith("-"):
                        assert opt in text, f"reference/cli.md lacks {full} {opt}: run `make docs`"
            if hasattr(sub, "commands"):
                walk(sub, full)

    walk(root, "chaoskit")


def test_every_exit_code_is_on_its_page():
    text = (REF / "exit-codes.md").read_text()
    for name in dir(errors):
        if name.startswith("EXIT_"):
            assert f"| {getattr(errors, name)} | `errors.{name}` |" in text, f"{name}: run `make docs`"


def test_every_journal_event_and_its_fields_are_on_its_page():
    from chaoskit.model.events import CATALOGUE, JOURNAL_VERSION

    text = (REF / "journal-events.md").read_text()
    assert f"journal version {JOURNAL_VERSION}" in text
    for name, cls in CATALOGUE.items():
        section = text.split(f"\n## `{name}`\n", 1)[1].split("\n## ", 1)[0]
        for field in cls.model_fields:
            if field not in ("t", "event"):
                assert f"| `{field}` |" in section, f"journal-events.md: {name}.{field} missing (make docs)"
