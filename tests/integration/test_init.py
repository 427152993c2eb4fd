"""`chaoskit init --url` against real servers: an OpenAI-compatible stand-in, the Triton reference deployment,
a plain HTTP server and a closed port; each file it writes validates and its --dry-run exits 0."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from chaoskit.reference.deploy import Deployment, RefOptions, port_free
from tests.conftest import ROOT, chaoskit, free_port, requires_triton

MODEL = "org/tiny-chat:v1"


def cli(tmp: Path, *args: str) -> tuple[int, str]:
    """Run the real CLI from `tmp` (outside the checkout): (exit code, stdout + stderr)."""
    proc = chaoskit(*args, state=tmp / "state", cwd=tmp)
    out, err = proc.communicate(timeout=120)
    return proc.returncode, out + err


def init_checked(tmp: Path, url: str, *more: str) -> tuple[str, str]:
    """init, then validate and --dry-run what it wrote (both must exit 0): (init's output, the file)."""
    code, said = cli(tmp, "init", "--url", url, *more)
    assert code == 0, said
    path = tmp / "first-experiment.yaml"
    code, out = cli(tmp, "validate", path.name)
    assert code == 0 and "warning" not in out, out
    code, out = cli(tmp, "run", "--dry-run", path.name)
    assert code == 0, out
    return said, path.read_text()


def serve(*argv: str) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, *argv], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                            text=True)
    assert proc.stdout is not None
    return proc


def wait_listening(port: int, proc: subprocess.Popen) -> None:
    for _ in range(200):
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return
        except OSError:
            assert proc.poll() is None, "the server exited"
            subprocess.run(["sleep", "0.05"], check=True)
    raise AssertionError(f"nothing listens on {port}")


@pytest.fixture
def openai_server() -> Iterator[str]:
    port = free_port()
    proc = serve("-m", "tests.helpers.openai_standin", str(port), MODEL)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
    yield f"http://127.0.0.1:{port}"
    proc.kill()
    proc.wait()


def free_block(n: int, start: int = 18640) -> int:
    """The first port p from `start` (in steps of 8) with p..p+n-1 all free on 127.0.0.1."""
    for base in range(start, 19000, 8):
        if all(port_free("127.0.0.1", p) for p in range(base, base + n)):
            return base
    raise AssertionError("no free port block")


@pytest.fixture(scope="module")
def triton_url(tmp_path_factory) -> Iterator[str]:
    d = Deployment(tmp_path_factory.mktemp("ref"))
    facts = d.up(RefOptions(port=free_block(4), replicas=1), say=lambda _m: None)
    try:
        yield facts["url"]
    finally:
        d.down(say=lambda _m: None)


def test_openai_server_detected_model_written(tmp_path, openai_server):
    said, text = init_checked(tmp_path, openai_server)
    assert f"detected openai at {openai_server}, model {MODEL}" in said
    assert f'model: "{MODEL}"' in text and "api: openai" in text and f'url: "{openai_server}"' in text
    assert "type: llm.proxy" in text and "share: 5%" in text and "abort_when:" in text and "--var fix=true" in text
    port = next(line.split()[1] for line in text.splitlines() if line.startswith("  proxy_port:"))
    assert f"point a client at http://127.0.0.1:{port}" in said
    for cmd in ("validate", "run --dry-run", "run"):
        assert f"chaoskit {cmd} first-experiment.yaml" in said


@requires_triton
def test_triton_reference_detected(tmp_path, triton_url):
    said, text = init_checked(tmp_path, triton_url)
    assert f"detected triton at {triton_url}, model tiny_lm " in said, said
    assert 'model: "tiny_lm"' in text and "api: triton" in text and '"{url}/v2/models/{model}/ready"' in text


def test_plain_http_server_detected(tmp_path):
    port = free_port()
    proc = serve("-m", "http.server", str(port), "--bind", "127.0.0.1", "--directory", str(tmp_path))
    try:
        wait_listening(port, proc)
        said, text = init_checked(tmp_path, f"http://127.0.0.1:{port}")
    finally:
        proc.kill()
        proc.wait()
    assert "detected http" in said and "api: http" in text and 'match: {path: "/*"}' in text
    assert 'path: "/"' in text and "model:" not in text


def test_closed_port_writes_template_and_says_so(tmp_path):
    url = f"http://127.0.0.1:{free_port()}"
    said, text = init_checked(tmp_path, url)
    assert f"could not detect what serves {url}: wrote a template" in said and "connection refused" in said
    assert "NOT DETECTED" in text and 'model: "MODEL"' in text and "TODO: not detected" in text


def test_server_that_never_answers_times_out_in_2s(tmp_path):
    with socket.socket() as listener:  # accepts connections (the kernel's backlog) but never answers
        listener.bind(("127.0.0.1", 0))
        listener.listen(8)
        url = f"http://127.0.0.1:{listener.getsockname()[1]}"
        t0 = time.monotonic()
        code, said = cli(tmp_path, "init", "--url", url)
        took = time.monotonic() - t0
    assert code == 0 and "no answer within 2 s" in said and "wrote a template" in said, said
    assert took < 8, took  # one 2 s timeout, not one per check


def test_pid_gives_process_signal_and_existing_file_needs_force(tmp_path, openai_server):
    sleeper = subprocess.Popen(["sleep", "600"])
    try:
        said, text = init_checked(tmp_path, openai_server, "--pid", str(sleeper.pid))
        assert "type: process.signal" in text and f"pid: {sleeper.pid}" in text and "SIGSTOP" in text
        assert "llm.proxy" not in text and f"SIGSTOP of PID {sleeper.pid}" in said
        code, out = cli(tmp_path, "init", "--url", openai_server)
        assert code == 2 and "first-experiment.yaml exists" in out and "--force" in out
        assert "Traceback" not in out and (tmp_path / "first-experiment.yaml").read_text() == text
        code, out = cli(tmp_path, "init", "--url", openai_server, "--force")
        assert code == 0 and "llm.proxy" in (tmp_path / "first-experiment.yaml").read_text()
    finally:
        sleeper.kill()
        sleeper.wait()


def test_process_name_that_matches_nothing_is_said(tmp_path):
    code, said = cli(tmp_path, "init", "--url", f"http://127.0.0.1:{free_port()}", "--process-name",
                     "^no-such-proc-x$")
    text = (tmp_path / "first-experiment.yaml").read_text()
    assert code == 0 and "no running process's name matches /^no-such-proc-x$/" in said, said
    assert 'process: "^no-such-proc-x$"' in text and 'name: "{process}"' in text and "# TODO: no running" in text


@pytest.mark.parametrize("args, says", [
    (["--url", "http://127.0.0.1:8000/v1"], "without a path"),
    (["--url", "localhost:8000"], "expected http://host:port"),
    (["--url", "https://127.0.0.1:8443"], "plain HTTP"),
    (["--url", "http://127.0.0.1:8000", "--pid", "1", "--process-name", "x"], "give one"),
    (["--url", "http://127.0.0.1:8000", "--name", "my experiment"], "--name"),
    (["--url", "http://127.0.0.1:8000", "--process-name", "("], "not a regular expression"),
    (["--url", "http://127.0.0.1:8000", "--pid", "1"], "refuses to pause"),
])
def test_user_mistakes_exit_2_with_one_line(tmp_path, args, says):
    code, out = cli(tmp_path, "init", *args)
    assert code == 2 and says in out and "Traceback" not in out, out
    assert not list(tmp_path.glob("*.yaml"))
