"""The CI templates in docs/ci/ as a user's repository runs them: their commands, read from the YAML (GitHub's
`run:` steps, GitLab's before_script/script/after_script lines), run in order by bash in an empty directory laid
out as the checkout of a repository (its chaos/ experiments and the wheel at CHAOSKIT_WHEEL), against a stand-in
service the test starts on 127.0.0.1. The job's exit code is the gate: 0 when every experiment held, 1 when one
deviated; the JUnit file is where the template uploads it.

Run as the job would, with four differences, each kept to the environment:
- `apt-get` lines install the container image's packages: never run on the test host (the tests never change it);
- pip runs offline (PIP_NO_INDEX, PIP_NO_DEPS) and the dependencies come from the project's .venv through
  PYTHONPATH: a directory of links to its site-packages less pip and chaoskit's own editable install, so chaoskit
  comes from the wheel the template installs (each job checks that);
- `python3` is this interpreter's base Python;
- CHAOSKIT_STATE_DIR is the test's own: `chaoskit rollback --all` never reaches the host's ledgers."""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
import sysconfig
import time
import urllib.request
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import yaml

from tests.conftest import ROOT, free_port
from tests.helpers.installed import User, user_env

TEMPLATES = ROOT / "docs" / "ci"
STEPS_WE_EMULATE = {"actions/checkout@v4", "actions/upload-artifact@v4"}

HELD = """\
apiVersion: chaoskit/v1
kind: Experiment
metadata: {{name: answers, description: the service answers its health check through a pause}}
steadyState:
  probes:
    - {{name: health, type: http, url: "http://127.0.0.1:{port}/health", timeout: 1s, expect: {{status: 200}}}}
  after: {{within: 5s, every: 250ms}}
method:
  - pause: 1s
"""

DEVIATES = """\
apiVersion: chaoskit/v1
kind: Experiment
metadata: {{name: frozen, description: the service frozen for 1s misses its latency objective}}
steadyState:
  probes:
    - name: health
      type: http
      url: "http://127.0.0.1:{port}/health"
      timeout: 500ms
      expect: {{status: 200, latency_ms: "< 300"}}
  during: {{every: 250ms}}
  after: {{within: 5s, every: 250ms}}
method:
  - name: freeze
    inject: {{type: process.signal, name: 'tests\\.helpers\\.openai_standin {port} ', full_cmdline: true,
              signal: SIGSTOP}}
    duration: 1s
"""


@dataclass
class Job:
    """What one run of a template's job did: each command with its exit code (None: not run), and the job's."""

    commands: list[tuple[str, int | None]] = field(default_factory=list)
    exit_code: int = 0
    output: str = ""

    def code_of(self, word: str) -> int | None:
        (code,) = [c for cmd, c in self.commands if word in cmd]
        return code


@dataclass
class Template:
    """A template read from its YAML: the job's variables, where it keeps the JUnit file, how its job runs."""

    name: str
    doc: dict

    @property
    def job(self) -> dict:
        if self.name == "github-actions.yml":
            (job,) = self.doc["jobs"].values()
            return job
        return self.doc["chaoskit"]

    @property
    def variables(self) -> dict[str, str]:
        return {k: str(v) for k, v in self.job.get("env" if self.name == "github-actions.yml" else "variables").items()}

    @property
    def junit(self) -> str:
        if self.name == "github-actions.yml":
            (upload,) = [s for s in self.job["steps"] if s.get("uses", "").startswith("actions/upload-artifact")]
            return str(Path(upload["with"]["path"]) / "junit.xml")
        return self.job["artifacts"]["reports"]["junit"]

    def commands(self) -> list[str]:
        if self.name == "github-actions.yml":
            return [s["run"] for s in self.job["steps"] if "run" in s]
        return [*self.job["before_script"], *self.job["script"], *self.job["after_script"]]

    def run(self, repo: Path, env: dict[str, str]) -> Job:
        env = {**env, **self.variables}
        return _github(self.job, repo, env) if self.name == "github-actions.yml" else _gitlab(self.job, repo, env)


def _bash(command: str, repo: Path, env: dict[str, str], job: Job) -> int:
    """One command as the runner runs it (bash -e -o pipefail); an apt-get line is recorded, not run."""
    if command.startswith("apt-get "):
        job.commands.append((command, None))
        return 0
    started = time.monotonic()
    p = subprocess.run(["bash", "--noprofile", "--norc", "-e", "-o", "pipefail", "-c", command], cwd=repo, env=env,
                       capture_output=True, text=True, timeout=120)
    job.commands.append((command, p.returncode))
    job.output += f"$ {command}\n{p.stdout}{p.stderr}(exit {p.returncode}, {time.monotonic() - started:.1f} s)\n"
    return p.returncode


def _github(job_doc: dict, repo: Path, env: dict[str, str]) -> Job:
    """Steps in order; after a failed step only `if: always()` steps run; the job fails with the first failure."""
    job = Job()
    for step in job_doc["steps"]:
        if "uses" in step:
            assert step["uses"] in STEPS_WE_EMULATE, step  # checkout: the test lays out the repository first
            continue
        if job.exit_code and step.get("if") != "always()":
            job.commands.append((step["run"], None))
            continue
        code = _bash(step["run"], repo, env, job)
        job.exit_code = job.exit_code or code
    return job


def _gitlab(job_doc: dict, repo: Path, env: dict[str, str]) -> Job:
    """before_script and script in one shell that stops at the first failing line; after_script always, apart."""
    job = Job()
    for line in [*job_doc["before_script"], *job_doc["script"]]:
        if job.exit_code:
            job.commands.append((line, None))
            continue
        job.exit_code = _bash(line, repo, env, job)
    for line in job_doc["after_script"]:
        _bash(line, repo, env, job)
    return job


def _calls_make(command: str) -> bool:
    words = shlex.split(command, comments=True)
    return any(w == "make" and (i == 0 or words[i - 1] in ("&&", "||", ";", "|", "sudo", "then", "do"))
               for i, w in enumerate(words))


@pytest.fixture(scope="module")
def dependencies(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The project's .venv site-packages as links, less pip (the template venv's own runs) and chaoskit's
    editable install (its metadata would make pip skip the wheel)."""
    d = tmp_path_factory.mktemp("dependencies")
    for entry in Path(sysconfig.get_paths()["purelib"]).iterdir():
        name = entry.name.lower()
        if not name.startswith(("chaoskit", "__editable__", "pip", "_chaoskit")) and not name.endswith(".pth"):
            (d / entry.name).symlink_to(entry)
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture(scope="module")
def service() -> Iterator[tuple[int, subprocess.Popen]]:
    """The user's service: an OpenAI-compatible stand-in on 127.0.0.1 (GET /health answers 200)."""
    port = free_port()
    p = subprocess.Popen([sys.executable, "-m", "tests.helpers.openai_standin", str(port), "ci-model"], cwd=ROOT,
                         stdout=subprocess.PIPE, text=True)
    try:
        assert p.stdout is not None and p.stdout.readline().strip() == "ready"
        yield port, p
    finally:
        p.kill()
        p.wait()


def _repository(top: Path, template: Template, user: User, port: int, experiments: list[str]) -> Path:
    """A checkout of the user's repository: chaos/ with EXPERIMENTS and the wheel where CHAOSKIT_WHEEL says."""
    repo = top / "repo"
    (repo / "chaos").mkdir(parents=True)
    for i, text in enumerate(experiments):
        (repo / "chaos" / f"{i + 1:02d}.yaml").write_text(text.format(port=port))
    wheel = repo / template.variables["CHAOSKIT_WHEEL"]
    assert wheel.name == user.wheel.name, "the template names another wheel than this tree builds"
    wheel.parent.mkdir(parents=True)
    shutil.copy2(user.wheel, wheel)
    return repo


def _environment(top: Path, dependencies: Path) -> dict[str, str]:
    bin_dir = top / "bin"
    bin_dir.mkdir()
    (bin_dir / "python3").symlink_to(sys._base_executable)  # type: ignore[attr-defined]
    env = user_env()
    env.update(PATH=f"{bin_dir}{os.pathsep}{env['PATH']}", PYTHONPATH=str(dependencies), PIP_NO_INDEX="1",
               PIP_NO_DEPS="1", PIP_DISABLE_PIP_VERSION_CHECK="1", CHAOSKIT_STATE_DIR=str(top / "state"),
               GITHUB_STEP_SUMMARY=str(top / "step-summary.md"))
    return env


def _answers(port: int) -> bool:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
        return r.status == 200


TEMPLATE_NAMES = ["github-actions.yml", "gitlab-ci.yml"]


@pytest.mark.parametrize("name", TEMPLATE_NAMES)
def test_no_template_calls_make_or_runs_the_bundled_scenarios(name):
    template = Template(name, yaml.safe_load((TEMPLATES / name).read_text()))
    commands = template.commands()
    assert [c for c in commands if _calls_make(c)] == []
    assert [c for c in commands if "sits2026" in c or ".venv/" in c] == []
    assert any(c.startswith(".chaoskit-venv/bin/chaoskit run chaos/ --ci") for c in commands)
    assert _calls_make("apt-get update && make setup") and not _calls_make("echo make")


@pytest.mark.parametrize("name", TEMPLATE_NAMES)
@pytest.mark.parametrize("outcome", ["held", "deviated"])
def test_the_template_gates_on_the_experiments(name, outcome, user, dependencies, service, tmp_path):
    """held: exit 0 and a JUnit file without failures; deviated (a second experiment freezes the service for 1 s
    past its latency objective): the run's exit 1 fails the job, the rollback still runs and thaws the service."""
    port, server = service
    template = Template(name, yaml.safe_load((TEMPLATES / name).read_text()))
    experiments = [HELD] if outcome == "held" else [HELD, DEVIATES]
    repo = _repository(tmp_path, template, user, port, experiments)
    env = _environment(tmp_path, dependencies)
    job = template.run(repo, env)
    assert [c for c, code in job.commands if code is None] == [c for c, _ in job.commands if c.startswith("apt-get")]
    assert job.code_of("chaoskit doctor") == 0 and job.code_of("rollback --all") == 0, job.output
    assert job.exit_code == job.code_of("chaoskit run chaos/") == (0 if outcome == "held" else 1), job.output
    suites = ET.parse(repo / template.junit).getroot().iter("testsuite")
    failed = {x.get("name"): int(x.get("failures", "0")) + int(x.get("errors", "0")) > 0 for x in suites}
    assert failed == ({"chaoskit.answers": False} if outcome == "held" else
                      {"chaoskit.answers": False, "chaoskit.frozen": True}), job.output
    if name == "github-actions.yml":  # --ci appends the summary to the job's page
        summary = (tmp_path / "step-summary.md").read_text()
        assert "answers: held (exit 0)" in summary and ("frozen: deviated (exit 1)" in summary) is (outcome != "held")
    where = subprocess.run([str(repo / ".chaoskit-venv" / "bin" / "python"), "-c", "import chaoskit; print(chaoskit.__file__)"],
                           cwd=repo, env=env, capture_output=True, text=True, check=True).stdout.strip()
    assert Path(where).is_relative_to(repo / ".chaoskit-venv"), where  # the wheel the template installed
    assert _answers(port) and server.poll() is None

