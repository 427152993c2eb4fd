"""Every YAML example in the README and docs/ validates: whole experiments as they are, method steps and probe
lists inside a minimal experiment (placeholders allowed where a reference deployment supplies them). The
README stays a quickstart (at most 15 KB) and nothing links outside the repository."""

from __future__ import annotations

import re
import textwrap
from pathlib import Path

import pytest
import yaml

from chaoskit.app.matrix import prepare
from chaoskit.experiment.loader import load_experiment

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
HEAD = """\
apiVersion: chaoskit/v1
kind: Experiment
metadata: {name: docs-example}
target: {reference: triton, url: "http://127.0.0.1:8000"}
"""
STEADY = "steadyState:\n  probes: [{name: ok, type: command, argv: ['true']}]\n"
METHOD = "method:\n  - pause: 1s\n"


def _blocks() -> list[tuple[str, str]]:
    out = []
    for page in PAGES:
        text = page.read_text()
        for m in re.finditer(r"```ya?ml\n(.*?)```", text, re.S):
            line = text[:m.start()].count("\n") + 2
            out.append((f"{page.relative_to(ROOT)}:{line}", textwrap.dedent(m.group(1))))
    return out


def _as_experiment(text: str) -> str:
    """The block as a whole experiment: a method (steps or `method:`), or steady-state probes."""
    if "apiVersion: chaoskit/v1" in text:
        return text
    data = yaml.safe_load(text)
    if isinstance(data, dict) and "method" in data:
        return HEAD + STEADY + text
    steps = data if isinstance(data, list) else []
    if steps and all(isinstance(s, dict) and ({"inject", "pause", "parallel", "include"} & set(s)) for s in steps):
        return HEAD + STEADY + "method:\n" + textwrap.indent(text, "  ")
    if steps and all(isinstance(s, dict) and "type" in s for s in steps):
        return HEAD + "steadyState:\n  probes:\n" + textwrap.indent(text, "    ") + METHOD
    raise AssertionError(f"a YAML example that is neither an experiment, method steps nor probes:\n{text}")


BLOCKS = _blocks()


def test_there_are_examples():
    assert len(BLOCKS) >= 10 and any(where.startswith("README.md") for where, _ in BLOCKS)


@pytest.mark.parametrize("where, text", BLOCKS, ids=[w for w, _ in BLOCKS])
def test_each_yaml_example_validates(where, text, tmp_path, monkeypatch):
    monkeypatch.setenv("CHAOSKIT_REF_DIR", str(tmp_path / "no-ref"))  # its facts wait for run time
    f = tmp_path / "example.yaml"
    if "kind: Matrix" in text:  # a matrix file: it and every cell's experiment
        f.write_text(text)
        prepare(f, tmp_path / "out", resume=False)
        return
    f.write_text(_as_experiment(text))
    load_experiment(f, strict=False)


def test_the_readme_is_a_quickstart_and_nothing_links_outside():
    readme = (ROOT / "README.md").read_bytes()
    assert len(readme) <= 15 * 1024
    for page in PAGES:
        assert "../shared" not in page.read_text(), page
    for page in PAGES:  # relative links point at files that exist
        for target in re.findall(r"\]\(([^)#:]+)(?:#[^)]*)?\)", page.read_text()):
            assert (page.parent / target).exists(), f"{page.relative_to(ROOT)}: broken link {target}"


def test_each_generated_reference_page_has_a_checked_example():
    """docs/reference/ (scripts/gen_reference.py) gives every injector and probe one example; each is among the
    blocks validated above, so an example the generator wrote that no longer loads fails here too."""
    from chaoskit.injectors import INJECTORS
    from chaoskit.probes import PROBES

    checked = {where.rsplit(":", 1)[0] for where, _ in BLOCKS}
    for kind, classes in (("injectors", INJECTORS), ("probes", PROBES)):
        for cls in classes:
            assert f"docs/reference/{kind}/{cls.type}.md" in checked, f"{kind}/{cls.type}: no example (make docs)"


def test_the_readme_points_into_the_site():
    readme = (ROOT / "README.md").read_text()
    assert "make docs" in readme
    for page in ("docs/getting-started.md", "docs/reference/index.md", "docs/sits2026/story.md"):
        assert f"]({page})" in readme, page


def test_every_sits2026_scenario_is_in_the_scenario_library_page():
    from chaoskit.paths import library

    page = (ROOT / "docs" / "sits2026" / "scenarios.md").read_text()
    names = sorted(f.stem for f in (library("experiments") / "sits2026").glob("*.yaml"))
    assert names and [n for n in names if f"`{n}`" not in page] == []
