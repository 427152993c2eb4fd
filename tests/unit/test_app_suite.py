"""Which --var a suite gives each file, decided by loading the file (never by reading an error's text): one
that declares it (even with a value it refuses), one that uses it undeclared, not one that has no such variable,
not one that cannot load either way (its run says why)."""

from __future__ import annotations

from pathlib import Path

from chaoskit.app.suite import vars_for

HEAD = """\
apiVersion: chaoskit/v1
kind: Experiment
metadata: {name: x}
steadyState:
  probes:
    - {name: ok, type: command, argv: ["true"], expect: {exit_code: 0}}
"""
DECLARES = HEAD.replace("steadyState", "vars: {dur: 1s}\nsteadyState") + 'method:\n  - pause: "{dur}"\n'
USES = HEAD + 'method:\n  - pause: "{dur}"\n'
NEITHER = HEAD + "method:\n  - pause: 1s\n"
INVALID = NEITHER.replace("expect:", "expct:")


def _file(tmp_path: Path, name: str, body: str) -> Path:
    (tmp_path / name).write_text(body)
    return tmp_path / name


def test_a_file_gets_the_variables_it_declares_or_uses(tmp_path):
    given = {"dur": "2s", "other": "1"}
    assert vars_for(_file(tmp_path, "d.yaml", DECLARES), given) == {"dur": "2s"}
    assert vars_for(_file(tmp_path, "u.yaml", USES), given) == {"dur": "2s"}
    assert vars_for(_file(tmp_path, "n.yaml", NEITHER), given) == {}
    assert vars_for(_file(tmp_path, "i.yaml", INVALID), given) == {}


def test_a_declared_variable_with_a_value_the_file_refuses_is_still_its_own(tmp_path):
    assert vars_for(_file(tmp_path, "d.yaml", DECLARES), {"dur": "soon"}) == {"dur": "soon"}
