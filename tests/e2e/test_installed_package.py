"""chaoskit as a user installs it: the wheel built from this tree, installed into a fresh venv in a temporary
directory, every command run from a directory outside the checkout with no CHAOSKIT_* variable (nor
PYTHONPATH) set. What a run needs — the eBPF sources, the probe and fault libraries, the experiments and their
data — must come from the installed package, not from the checkout.

The venv gets chaoskit from the wheel only (the `user` fixture, tests/e2e/conftest.py and tests/helpers/installed.py);
its dependencies come from the project's .venv through a plain path entry in a .pth file, which leaves the editable
chaoskit installed there invisible; test_chaoskit_is_the_installed_wheel checks that.
`chaoskit ref install triton` installs the engine the scenario runs on; `chaoskit init` writes a first
experiment for an OpenAI-compatible stand-in and, with nothing listening, a template."""

from __future__ import annotations

import json
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

from tests.conftest import ROOT, TRITON_MISSING, bcc_missing
from tests.helpers.installed import LIBRARY

VERSION = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]


def _shipped(path: Path) -> bool:
    return "__pycache__" not in path.parts and path.suffix not in (".pyc", ".so")


def test_the_wheel_carries_every_file_of_the_package(user):
    """Every file of chaoskit/ in this tree, and of the library's folders beside it (eBPF sources, YAML and data
    files) at chaoskit/library/KIND/, is in the wheel: a new kind of file the package-data globs miss fails here,
    not on a user's machine."""
    names = set(zipfile.ZipFile(user.wheel).namelist())
    tree = {str(p.relative_to(ROOT)) for p in (ROOT / "chaoskit").rglob("*") if p.is_file() and _shipped(p)}
    tree |= {f"chaoskit/library/{p.relative_to(ROOT)}" for kind in LIBRARY for p in (ROOT / kind).rglob("*")
             if p.is_file() and _shipped(p)}
    assert sorted(tree - names) == []
    library = [n for n in names if n.startswith("chaoskit/library/")]
    assert {n.split("/")[2] for n in library} == {"__init__.py", *LIBRARY}
    assert any(n.startswith("chaoskit/library/experiments/sits2026/data/") for n in library)
    assert not [n for n in names if n.split("/")[0] in LIBRARY]  # only under chaoskit/library/


def test_chaoskit_is_the_installed_wheel(user):
    where = Path(user.python("import chaoskit; print(chaoskit.__file__)"))
    assert where.is_relative_to(user.venv), where
    assert user.python("from chaoskit.paths import library; print(library('bpf'))").startswith(str(user.venv))


FORKED_PROXY = """
import socket, time, uuid
from chaoskit.injectors import helper_proc
from chaoskit.injectors.forkserver.client import Forkserver
from chaoskit.targets.process import cmdline
with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
fs, token = Forkserver(), f"chaoskit-proxy-{uuid.uuid4().hex}"
ref = fs.spawn(token, ["chaoskit.injectors.proxy.server", f"127.0.0.1:{port}", "127.0.0.1:9", "[]",
                      str(time.time() + 30)], "proxy")
fs.close()
print(cmdline(ref.pid)[0], helper_proc.running(token, ref))
helper_proc.stop(token, ref=ref)
print(helper_proc.running(token, ref))
"""


def test_a_run_forks_its_proxy_helpers_from_the_installed_package(user):
    """The run's proxy forkserver runs without site (its dependencies from the .pth-added site-packages)."""
    forked, stopped = user.python(FORKED_PROXY).splitlines()
    where, running = forked.split()
    assert Path(where).is_relative_to(user.venv) and where.endswith("chaoskit/injectors/proxy/helper.py")
    assert (running, stopped) == ("True", "False")


def test_version_comes_from_the_package_metadata(user):
    p = user.run("version")
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == f"chaoskit {VERSION}"
    assert user.wheel.name.startswith(f"chaoskit-{VERSION}-")


def test_list_shows_every_bundled_experiment_by_name(user):
    p = user.run("list")
    assert p.returncode == 0, p.stdout + p.stderr
    names = sorted(str(f.relative_to(ROOT / "experiments").with_suffix(""))
                   for f in (ROOT / "experiments").rglob("*.yaml"))
    assert len(names) >= 20
    rows = {line.split("|")[1].strip() for line in p.stdout.splitlines() if line.count("|") >= 3}  # piped: ASCII
    assert [n for n in names if n not in rows] == [], p.stdout
    assert "invalid" not in p.stdout and str(user.venv) in p.stdout  # each loaded from the installed package


def test_validate_includes_a_bundled_probe_from_an_empty_directory(user, tmp_path):
    d = tmp_path / "empty"
    d.mkdir()
    (d / "mine.yaml").write_text("""\
apiVersion: chaoskit/v1
kind: Experiment
metadata: {name: mine}
target: {reference: triton}
steadyState:
  probes:
    - include: triton-ready
method:
  - pause: 1s
""")
    p = user.run("validate", "mine.yaml", cwd=d)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "✓ mine.yaml: mine" in p.stdout
    by_name = user.run("validate", "sits2026/health-check-blindspot", "basic/stop-http-server.yaml")
    assert by_name.returncode == 0 and by_name.stdout.count("✓") == 2, by_name.stdout + by_name.stderr


def test_an_ebpf_probe_compiles_from_the_installed_sources_and_holds(user, tmp_path):
    why = bcc_missing("oom_kills")
    if why is not None:
        pytest.skip(f"eBPF cannot run here: {why}")
    bystander = subprocess.Popen(["sleep", "600"])  # OOM kills in its tree only: other tests may OOM-kill theirs
    try:
        (tmp_path / "ooms.yaml").write_text(f"""\
apiVersion: chaoskit/v1
kind: Experiment
metadata: {{name: no-oom-kills}}
steadyState:
  probes: [{{name: ooms, type: ebpf, program: oom_kills, pid: {bystander.pid}, expect: {{count: "== 0"}}}}]
method:
  - pause: 1s
""")
        p = user.run("run", str(tmp_path / "ooms.yaml"), "--plain", "--out", str(tmp_path / "o"), timeout=120)
    finally:
        bystander.kill()
        bystander.wait()
    assert p.returncode == 0, p.stdout + p.stderr
    summary = json.loads((tmp_path / "o" / "summary.json").read_text())
    samples = [s for s in summary["samples"] if s["probe"] == "ooms"]
    assert summary["verdict"] == "held" and samples and all(s["values"]["count"] == 0 for s in samples)


@pytest.mark.skipif(TRITON_MISSING is not None, reason=f"Triton not installed: {TRITON_MISSING}")
@pytest.mark.timeout(900)  # above its own timeouts (ref install 600 s, the run 180 s), which fail with the output
def test_a_bundled_scenario_runs_by_name(user, tmp_path):
    """The scenario brings up its own Triton replicas (in ./.chaoskit/, the directory it runs in), whose python
    backend imports chaoskit from the installed package, and takes them down; no ledger of the run (nor of its
    deployment) is left in the state directory."""
    from chaoskit.reference.deploy import Deployment
    from chaoskit.targets.process import ProcessRef, is_alive

    engine = user.run("ref", "install", "triton", timeout=600)  # as a user does; "already installed" after once
    assert engine.returncode == 0 and "installed (tritonserver " in engine.stdout, engine.stdout + engine.stderr
    p = user.run("run", "sits2026/health-check-blindspot", "--var", "fix=true", "--var", "duration=10s", "--plain", "--out",
                 str(tmp_path / "o"), cwd=tmp_path, timeout=180)
    deployments = sorted((tmp_path / ".chaoskit").glob("ref-*"))
    alive = [x for d in deployments for x in Deployment(d).processes() if is_alive(ProcessRef.from_json(x))]
    gateway_logs = "".join(f.read_text() for d in deployments for f in [d / "logs" / "gateway.log"] if f.exists())
    assert p.returncode == 0, p.stdout + p.stderr + "\ngateway.log:\n" + gateway_logs  # ejections, readmissions
    assert deployments and alive == []
    summary = json.loads((tmp_path / "o" / "summary.json").read_text())
    assert summary["verdict"] == "held" and summary["rollback_complete"]
    ledgers = Path(user.python("from chaoskit.paths import state_dir; print(state_dir() / 'ledgers')"))
    assert sorted(ledgers.glob(f"{summary['run_id']}*")) == []


@pytest.mark.parametrize("serving", [True, False], ids=["openai-standin", "closed-port"])
def test_init_writes_an_experiment_that_validates_and_dry_runs(user, tmp_path, serving):
    from tests.conftest import free_port

    port = free_port()
    server = subprocess.Popen([sys.executable, "-m", "tests.helpers.openai_standin", str(port), "wheel-model"],
                              cwd=ROOT, stdout=subprocess.PIPE, text=True) if serving else None
    try:
        if server is not None:
            assert server.stdout is not None and server.stdout.readline().strip() == "ready"
        d = tmp_path / "mine"
        d.mkdir()
        p = user.run("init", "--url", f"http://127.0.0.1:{port}", cwd=d)
        assert p.returncode == 0, p.stdout + p.stderr
        text = (d / "first-experiment.yaml").read_text()
        assert ("wheel-model" in text) is serving
        assert ("could not detect" in p.stdout + p.stderr) is not serving
        assert user.run("validate", "first-experiment.yaml", cwd=d).returncode == 0
        dry = user.run("run", "--dry-run", "first-experiment.yaml", cwd=d)
        assert dry.returncode == 0, dry.stdout + dry.stderr
    finally:
        if server is not None:
            server.kill()
            server.wait()
