"""`chaoskit ref install triton|vllm`: a real pip install into an empty directory (from pip's cache once it has the
wheel), then "already installed" at once; a Triton replica served from that directory; an index that cannot be
reached is one clear line with pip's own words, and leaves nothing behind."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from chaoskit.reference import triton
from chaoskit.reference.scenario import free_port_block
from tests.conftest import ROOT

pytestmark = pytest.mark.timeout(900)  # above cli()'s own 600 s (a real pip install), which fails with pip's output


def cli(*args: str, env: dict[str, str], timeout: float = 600) -> tuple[subprocess.CompletedProcess, float]:
    t0 = time.monotonic()
    p = subprocess.run([sys.executable, "-m", "chaoskit", *args], capture_output=True, text=True,
                       env={**os.environ, **env}, cwd=ROOT, timeout=timeout)
    return p, time.monotonic() - t0


def took(stdout: str) -> float:
    """The seconds the command reports for itself (from its start, after the interpreter's)."""
    return float(re.search(r"; ([0-9.]+) s\)$", stdout.strip()).group(1))


def test_triton_installs_into_an_empty_directory_then_is_already_installed(tmp_path):
    home = tmp_path / "engines" / "triton"
    env = {"CHAOSKIT_TRITON_HOME": str(home), "CHAOSKIT_STATE_DIR": str(tmp_path / "state")}
    first, _ = cli("ref", "install", "triton", "--force", env=env)  # --force: this .venv may have its own
    assert first.returncode == 0, first.stdout + first.stderr
    assert first.stdout.startswith(f"triton: installed (tritonserver {home / triton.BINARY}; ")
    assert f"installing {triton.TRITON_PIN} " in first.stderr
    assert f"  pip: Collecting {triton.TRITON_PIN}" in first.stderr
    assert "  pip: Successfully installed nvidia-pytriton-0.7.0" in first.stderr
    assert sorted(p.name for p in home.parent.iterdir()) == ["triton"]  # no half-done directory beside it
    files = {p: p.stat().st_mtime_ns for p in home.rglob("*") if p.is_file()}
    second, _ = cli("ref", "install", "triton", env=env)
    assert second.returncode == 0, second.stdout + second.stderr
    assert second.stdout.startswith(f"triton: already installed (tritonserver {home / triton.BINARY}; ")
    # already installed: no pip run (it prints what it does) and not one file of the install written again
    # (how fast that check is, 0.1-0.7 s here with the box loaded or not, is no test's to judge)
    assert second.stderr == "", second.stderr
    assert {p: p.stat().st_mtime_ns for p in home.rglob("*") if p.is_file()} == files


def test_a_replica_runs_the_tritonserver_ref_install_put_there(tmp_path):
    """What was installed with --target serves: `ref up` starts that binary, with its own libraries."""
    home = tmp_path / "triton"
    env = {"CHAOSKIT_TRITON_HOME": str(home), "CHAOSKIT_STATE_DIR": str(tmp_path / "state")}
    p, _ = cli("ref", "install", "triton", "--force", env=env)
    assert p.returncode == 0, p.stderr
    d, port = tmp_path / "ref", free_port_block(1)  # all 4 ports free, below the ephemeral range
    up, _ = cli("ref", "up", "--replicas", "1", "--port", str(port), "--dir", str(d), "--json", env=env, timeout=120)
    try:
        assert up.returncode == 0, up.stdout + up.stderr
        status, _ = cli("ref", "status", "--dir", str(d), env=env)
        assert status.returncode == 0, status.stdout
        pid = json.loads(up.stdout)["replica_pid"]
        assert Path(f"/proc/{pid}/exe").resolve() == (home / triton.BINARY).resolve()
    finally:
        cli("ref", "down", "--dir", str(d), env=env, timeout=60)


def test_an_index_that_cannot_be_reached_is_one_clear_line(tmp_path):
    home = tmp_path / "empty" / "triton"
    env = {"CHAOSKIT_TRITON_HOME": str(home), "PIP_INDEX_URL": "http://127.0.0.1:9/simple",
           "PIP_RETRIES": "0", "CHAOSKIT_STATE_DIR": str(tmp_path / "state")}
    p, _ = cli("ref", "install", "triton", "--force", env=env, timeout=300)
    assert p.returncode == 4, p.stdout + p.stderr
    errors = [line for line in p.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "Traceback" not in p.stderr, p.stderr
    assert errors[0].startswith(f"error: installing {triton.TRITON_PIN} failed: cannot reach the package index "
                                "(PIP_INDEX_URL=http://127.0.0.1:9/simple: [Errno 111] Connection refused; "
                                "pip exited 1): ")
    assert f"ERROR: No matching distribution found for {triton.TRITON_PIN}" in errors[0]
    assert p.stdout == "" and not home.exists() and list(home.parent.iterdir()) == []


def test_vllm_already_installed_answers_at_once():
    """Only against a venv `make vllm` finished (never installs it here: ~2 GB)."""
    from chaoskit.reference import vllm

    busy = subprocess.run(["pgrep", "-f", "pip install"], capture_output=True, text=True).stdout.split()
    if busy:  # its check of the venv would wait on pip, not answer at once
        pytest.skip(f"another pip install is running on this host: {busy}")
    if not vllm.installed():
        pytest.skip(f"vLLM not installed in {vllm.home()} (make vllm)")
    env = {"CHAOSKIT_VLLM_HOME": str(vllm.home())}
    cli("ref", "install", "vllm", env=env)  # the first may import vllm once to check it (seconds)
    p, wall = cli("ref", "install", "vllm", env=env)
    assert p.returncode == 0, p.stdout + p.stderr
    assert p.stdout.startswith(f"vllm: already installed ({vllm.VLLM_PIN} + {vllm.TORCH_PIN} in {vllm.home() / 'venv'}")
    # at once: from its stamp, not by importing vllm (10 s or more here); 0.7 s seen for a check beside make test
    assert took(p.stdout) < 2.0 and wall < 6.0, (p.stdout, wall)


def test_engine_names_are_checked():
    p, _ = cli("ref", "install", "tgi", env={})
    assert p.returncode == 2 and p.stderr.strip() == ("error: ref install 'tgi': expected triton, vllm or gateway-NAME (NAME: "
                                                 "vllm-router, sglang-router, litellm, nginx, haproxy)")
    assert not Path(ROOT / ".chaoskit" / "tgi").exists()
