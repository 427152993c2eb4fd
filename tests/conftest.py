"""Shared fixtures: an isolated state dir, throwaway target processes, and a way to run the real CLI."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from chaoskit.errors import PreflightError
from chaoskit.targets.cgroups import IoHierarchy, find_io_hierarchy
from chaoskit.targets.process import proc_state  # noqa: F401  (re-exported for the tests)
from tests.helpers import cgroup_check
from tests.helpers.skipguard import pytest_configure  # noqa: F401  (CI set: a skip not in skips-allowed.txt fails)

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def state_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    d = tmp_path / "state"
    monkeypatch.setenv("CHAOSKIT_STATE_DIR", str(d))
    return d


@pytest.fixture(scope="session", autouse=True)
def own_caches(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """Every cache a test session fills is its own, never the user's ~/.cache: chaoskit's (what cbuild compiles:
    the native sender, the netem queue helper, the CUDA fault library) and every XDG-following tool's (pip,
    pytriton), in the session's temporary directory; so is chaoskit's state directory. The CLI and the helpers the
    tests start inherit them."""
    root = tmp_path_factory.mktemp("cache")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("XDG_CACHE_HOME", str(root))
        mp.setenv("CHAOSKIT_CACHE_DIR", str(root / "chaoskit"))
        # and a state directory of the session's own: a run a test starts without the state_dir fixture never
        # writes its ledgers into the host's /var/lib/chaoskit, nor replays the host's unfinished ones
        mp.setenv("CHAOSKIT_STATE_DIR", str(tmp_path_factory.mktemp("state")))
        yield root


@pytest.fixture
def sleeper() -> Iterator[subprocess.Popen]:
    """A real process to stop and resume; killed at the end whatever happens."""
    proc = subprocess.Popen(["sleep", "600"])
    yield proc
    proc.kill()
    proc.wait()


def wait_for(cond: Callable[[], bool], timeout: float = 10.0, every: float = 0.01) -> float:
    """Wait until cond() is true; return the seconds it took; fail the test on timeout."""
    t0 = time.monotonic()
    while not cond():
        if time.monotonic() - t0 > timeout:
            raise AssertionError(f"condition not met within {timeout}s")
        time.sleep(every)
    return time.monotonic() - t0


def ledgers(state: Path) -> list[Path]:
    return sorted((state / "ledgers").glob("*.jsonl")) if (state / "ledgers").is_dir() else []


def ledger_ops(path: Path) -> list[str]:
    return [json.loads(line)["op"] for line in path.read_text().splitlines() if line.strip()]


def chaoskit(*args: str, state: Path, env: dict[str, str] | None = None, **kw) -> subprocess.Popen:
    """`python -m chaoskit ARGS` with its own state directory (and `env` on top of this process's)."""
    env = {**os.environ, "CHAOSKIT_STATE_DIR": str(state), **(env or {})}
    return subprocess.Popen([sys.executable, "-m", "chaoskit", *args], env=env, cwd=kw.pop("cwd", ROOT),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kw)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _triton_missing() -> str | None:
    from chaoskit.reference import triton

    try:
        triton.wheel_root()
    except PreflightError as e:
        return str(e)
    return None


TRITON_MISSING = _triton_missing()
requires_triton = pytest.mark.skipif(TRITON_MISSING is not None, reason=f"Triton not installed: {TRITON_MISSING}")


def bcc_missing(program: str) -> str | None:
    """What this host lacks to run the eBPF probe `program` (None: nothing). Only the host's part: root, tracefs,
    kernel headers, bcc. A compile or load error of the project's own bpf/*.c is not a reason to
    skip: the test that uses the program fails with it."""
    from chaoskit.probes import ebpf

    if os.geteuid() != 0:
        return "needs root"
    if not (ebpf.TRACEFS / "events").is_dir():
        return f"tracefs is not mounted at {ebpf.TRACEFS}"
    headers = Path(f"/lib/modules/{os.uname().release}/build")
    if not headers.exists():
        return f"no kernel headers at {headers}"
    if not (ebpf.bpf_dir() / f"{program}.c").is_file():
        raise AssertionError(f"no eBPF program {program!r} in {ebpf.bpf_dir()}")
    try:
        ebpf.load_bcc()
    except PreflightError as e:
        return str(e)
    return None


@pytest.fixture
def no_kube_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """No kubeconfig anywhere chaoskit looks ($KUBECONFIG, ~/.kube/config, in-cluster), whatever this host has."""
    monkeypatch.delenv("KUBECONFIG", raising=False)
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))


@pytest.fixture
def cluster(api, tmp_path: Path):
    """The targets.kube.ClusterRef of the test module's `api` fixture (a FakeKubeApi whose kubeconfig it wrote
    to tmp_path/kubeconfig)."""
    from chaoskit.targets.kube import KubeCluster, resolve_cluster

    return resolve_cluster(KubeCluster(kubeconfig=str(tmp_path / "kubeconfig")))


FAKE_GPU_TOTAL = 4 << 30


@pytest.fixture
def fake_cuda(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Build the simulated CUDA driver (tests/helpers/fake_libcuda.c, a TEST DOUBLE: no GPU here), a device of
    FAKE_GPU_TOTAL bytes whose memory every process shares; every process started from here on uses it
    (through the environment). Its state file is returned."""
    import shutil

    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler to build the simulated CUDA driver")
    lib = tmp_path / "libcuda.so.1"
    subprocess.run([cc, "-shared", "-fPIC", "-O1", "-o", str(lib), str(ROOT / "tests/helpers/fake_libcuda.c")],
                   check=True)
    state = tmp_path / "fake-gpu.state"
    monkeypatch.setenv("CHAOSKIT_LIBCUDA", str(lib))
    monkeypatch.setenv("CHAOSKIT_FAKE_CUDA_STATE", str(state))
    monkeypatch.setenv("CHAOSKIT_FAKE_CUDA_TOTAL", str(FAKE_GPU_TOTAL))
    return state


def device_used() -> int:
    """Bytes in use on CUDA device 0 (the simulated one under fake_cuda)."""
    from chaoskit.gpu.cuda import Driver

    drv = Driver()
    drv.open_device(0)
    free, total = drv.info()
    return total - free


def write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def hierarchy_or_skip() -> IoHierarchy:
    """The block I/O hierarchy (cgroup v2 io or v1 blkio): skipped only where /proc/mounts shows none (read by the
    test, not by chaoskit's finder, which must then find it)."""
    return cgroup_check.hierarchy_or_skip(find_io_hierarchy, "io", "blkio")


@pytest.fixture
def loopdev(tmp_path):
    hierarchy_or_skip()
    img = tmp_path / "disk.img"
    with open(img, "wb") as f:
        f.truncate(64 * 1024 * 1024)
    try:
        dev = subprocess.run(["losetup", "--find", "--show", str(img)], check=True, capture_output=True,
                             text=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError) as e:
        pytest.skip(f"cannot create a loop device here: {e}")
    yield dev
    subprocess.run(["losetup", "-d", dev], check=False)


@pytest.fixture
def mounted(loopdev, tmp_path):
    """An ext4 filesystem on the test's loop device, mounted in the test's tmp dir."""
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    subprocess.run(["mkfs.ext4", "-q", "-F", loopdev], check=True, capture_output=True)
    subprocess.run(["mount", loopdev, str(mnt)], check=True)
    yield mnt
    subprocess.run(["umount", str(mnt)], check=True)


def native_sender_or_skip() -> None:
    """Skip where the host has no C compiler; a sender.c that does not compile fails the test (ChaoskitError)."""
    from chaoskit import cbuild
    from chaoskit.load import native

    if cbuild.compiler() is None:
        pytest.skip("no C compiler ($CC, cc or gcc) to build the native sender")
    native.build()


@pytest.fixture(params=["native", "python"])
def load_sender(request) -> str:
    """Each load-generator test that takes this runs with both senders (native skips without a C compiler)."""
    if request.param == "native":
        native_sender_or_skip()
    return request.param


@pytest.fixture(scope="session")
def vllm_pair(tmp_path_factory) -> Iterator[Path]:
    """Two CPU vLLM replicas behind the gateway (status health), started once for every test that needs vLLM
    (a start costs about a minute); the state dir. Those tests run last (pytest_collection_modifyitems), so
    the replicas are not idling beside the rest of the suite."""
    from chaoskit.reference import vllm
    from chaoskit.reference.deploy import Deployment, RefOptions
    from chaoskit.targets.process import group_members

    if not vllm.installed():
        pytest.skip(f"vLLM not installed in {vllm.home()} (make vllm)")
    d = Deployment(tmp_path_factory.mktemp("vllm") / "ref")
    facts = d.up(RefOptions(engine="vllm", replicas=2, port=18960), say=print)
    print(f"vLLM pair up in {facts['startup_s']} s")
    yield d.root
    pids = [p["pid"] for p in d.processes()]
    d.down(say=lambda _m: None)
    assert not any(group_members(p) for p in pids)


def vllm_facts(root: Path) -> dict:
    return json.loads((root / "facts.json").read_text())


_RUNNING: list[str] = []  # the test running now, for a stream stopped by scripts/test.sh's time limit (SIGINT)


def pytest_runtest_logstart(nodeid: str) -> None:
    _RUNNING[:] = [nodeid]


def pytest_runtest_logfinish() -> None:
    _RUNNING.clear()


def pytest_keyboard_interrupt() -> None:
    if _RUNNING:
        print(f"\ninterrupted in {_RUNNING[0]}", file=sys.stderr, flush=True)


def pytest_collection_modifyitems(items: list) -> None:
    """Tests on the shared vLLM pair last, together (a stable sort keeps every other order as it was)."""
    items.sort(key=lambda item: "vllm_pair" in getattr(item, "fixturenames", ()))
