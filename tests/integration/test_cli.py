"""The CLI as users run it: exit codes, messages without tracebacks, schema, list, doctor."""

from __future__ import annotations

import json

from tests.conftest import ROOT, chaoskit, write
from tests.integration.test_doctor import has_netem, has_queue_mode

BAD = """\
apiVersion: chaoskit/v1
kind: Experiment
metadata: {name: bad}
steadyState:
  probes: [{name: t, type: command, argv: ["true"], timeout: -1s}]
method:
  - inject: {type: host.memory_pressure, size: 1GiB, sise: 2}
    duration: 2 fortnights
"""


def test_validate_bad_file(tmp_path, state_dir):
    f = write(tmp_path / "bad.yaml", BAD)
    p = chaoskit("validate", str(f), state=state_dir)
    out, err = p.communicate(timeout=60)
    assert p.returncode == 2
    assert "Traceback" not in out + err
    assert f"{f}:5:" in err and "timeout: a duration cannot be negative" in err
    assert "method[0].inject.sise: unknown field 'sise' (did you mean 'size'?)" in err
    assert f"{f}:8:5: method[0].duration: expected a duration" in err


def test_validate_many_and_junk(tmp_path, state_dir):
    junk = tmp_path / "junk.yaml"
    junk.write_bytes(b"\x00\x01\x02")
    p = chaoskit("validate", "experiments/basic/stop-http-server.yaml", str(junk), str(tmp_path / "missing.yaml"),
                 state=state_dir)
    out, err = p.communicate(timeout=60)
    assert p.returncode == 2 and "Traceback" not in out + err
    assert "✓ experiments/basic/stop-http-server.yaml" in out
    assert "binary file" in err and "no such file" in err


def test_run_invalid_file_applies_nothing(tmp_path, state_dir):
    p = chaoskit("run", str(write(tmp_path / "bad.yaml", BAD)), "--out", str(tmp_path / "o"), state=state_dir)
    out, err = p.communicate(timeout=60)
    assert p.returncode == 2 and "Traceback" not in out + err
    assert err.count("unknown field 'sise'") == 1, err  # said once
    assert not (tmp_path / "o").exists() and not (state_dir / "ledgers").exists()


def test_run_bad_var(tmp_path, state_dir):
    p = chaoskit("run", "experiments/basic/stop-http-server.yaml", "--var", "oops", state=state_dir)
    out, err = p.communicate(timeout=60)
    assert p.returncode == 2 and "expected NAME=VALUE" in err


def test_schema_list_doctor(state_dir):
    p = chaoskit("schema", state=state_dir)
    schema = json.loads(p.communicate(timeout=60)[0])
    assert "steadyState" in schema["properties"] and "method" in schema["required"]
    p = chaoskit("list", state=state_dir)
    out = p.communicate(timeout=60)[0]
    assert "process.signal" in out and "host.memory_pressure" in out and "stop-http-server" in out
    p = chaoskit("doctor", "--json", state=state_dir)
    checks = {c["area"]: c for c in json.loads(p.communicate(timeout=120)[0])}
    assert checks["process.signal"]["ok"]
    assert checks["network.netem (kernel)"]["ok"] is (has_netem() or has_queue_mode())  # found independently
    assert all(c["detail"] for c in checks.values())


def test_rollback_arguments(state_dir):
    p = chaoskit("rollback", state=state_dir)
    assert p.communicate(timeout=60) and p.returncode == 2
    p = chaoskit("rollback", "--all", state=state_dir)
    assert "nothing to roll back" in p.communicate(timeout=60)[0] and p.returncode == 0


def test_version_option_and_command(state_dir):
    """`chaoskit --version` and `chaoskit version`: the installed distribution's version, exit 0."""
    from importlib.metadata import version

    for args in (("--version",), ("version",)):
        p = chaoskit(*args, state=state_dir)
        out, err = p.communicate(timeout=60)
        assert p.returncode == 0 and out == f"chaoskit {version('chaoskit')}\n", (args, out, err)


def test_validate_a_directory_as_run_takes_it(tmp_path, state_dir):
    """A directory stands for its *.yaml / *.yml files (not its subdirectories), each checked; an empty one is
    an error of its own."""
    d = tmp_path / "exps"
    (d / "deeper").mkdir(parents=True)
    good = write(d / "a-good.yml", (ROOT / "experiments/basic/stop-http-server.yaml").read_text())
    bad = write(d / "b-bad.yaml", BAD)
    write(d / "notes.txt", "not an experiment")
    write(d / "deeper" / "c.yaml", BAD)
    (tmp_path / "empty").mkdir()
    p = chaoskit("validate", str(d), state=state_dir)
    out, err = p.communicate(timeout=60)
    assert p.returncode == 2 and "Traceback" not in out + err
    assert out.splitlines() == [f"✓ {good}: stop-http-server (2 steps: 1 fault, 1 pause)"]
    assert f"{bad}:8:5: method[0].duration: expected a duration" in err and "deeper" not in err
    p = chaoskit("validate", str(tmp_path / "empty"), str(good), state=state_dir)
    out, err = p.communicate(timeout=60)
    assert p.returncode == 2 and f"✓ {good}" in out
    assert err.strip() == f"✗ {tmp_path / 'empty'}: no experiment files (*.yaml, *.yml) in this directory"
    bad.unlink()
    p = chaoskit("validate", str(d), state=state_dir)
    assert p.communicate(timeout=60) and p.returncode == 0
