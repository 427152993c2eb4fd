"""Find the real `tritonserver` shipped in the nvidia-pytriton wheel (installed by `chaoskit ref install triton`,
or in this interpreter's site-packages) and build its backend dir, argv and env."""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import sys
import sysconfig
import time
from collections.abc import Callable
from pathlib import Path

import psutil

from chaoskit.errors import ChaoskitError, PreflightError
from chaoskit.paths import engines_dir, package_parent
from chaoskit.reference.pipinstall import pip_missing, run_pip
from chaoskit.reference.tinylm import WEIGHTS_FILE, init_weights, save_weights
from chaoskit.targets.facts import TRITON_MODELS

MODEL_REPOSITORY = Path(__file__).resolve().parent / "model_repository"
TRITON_PIN = "nvidia-pytriton==0.7.0"
INSTALL_HINT = f"run `chaoskit ref install triton` (the tritonserver of the {TRITON_PIN} wheel, ~55 MB)"
BINARY = Path("pytriton") / "tritonserver" / "bin" / "tritonserver"
STAMP = ".chaoskit-installed"  # written last: a directory without it is an interrupted install
STUB = "triton_python_backend_stub"
EXIT_TIMEOUT_S = 3


def home() -> Path:
    """Where `chaoskit ref install triton` puts the wheel's files (pip --target): $CHAOSKIT_TRITON_HOME, else
    paths.engines_dir()/triton (.chaoskit/triton in a source tree, the cache directory for an installed package)."""
    return Path(os.environ.get("CHAOSKIT_TRITON_HOME", engines_dir() / "triton")).resolve()


def installed_home() -> Path | None:
    """home() when an install there completed."""
    h = home()
    return h if (h / STAMP).is_file() and (h / BINARY).is_file() else None


def site_root() -> Path | None:
    """The site-packages dir of this interpreter that holds pytriton/ (without importing pytriton)."""
    spec = importlib.util.find_spec("pytriton")
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations))).parent


def wheel_root() -> Path:
    """The dir holding pytriton/ and nvidia_pytriton.libs/: chaoskit's own install first, else this interpreter's
    site-packages (a checkout's .venv where `pip install nvidia-pytriton` was run)."""
    root = installed_home() or site_root()
    if root is None:
        raise PreflightError(f"Triton is not installed (not in {home()}, nor importable here); {INSTALL_HINT}")
    if not (root / BINARY).exists():
        raise PreflightError(f"no tritonserver binary under {root / 'pytriton'}; {INSTALL_HINT}")
    return root


def binary() -> Path:
    return wheel_root() / BINARY


def install(say: Callable[[str], None], force: bool = False) -> tuple[Path, bool]:
    """Install the wheel's files into home() unless tritonserver is already found (or `force`): into a fresh
    directory beside it, renamed into place once complete. Returns (the root, whether it was installed now)."""
    if not force:
        try:
            return wheel_root(), False
        except PreflightError:
            pass
    why = pip_missing(sys.executable)
    if why:
        raise PreflightError(f"installing {TRITON_PIN} needs pip: {why}")
    target = home()
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.name}.installing-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    say(f"installing {TRITON_PIN} (tritonserver and its libraries, ~55 MB download, ~145 MB) into {target}")
    started = time.monotonic()
    try:
        run_pip([sys.executable, "-m", "pip", "install", "--no-deps", "--no-input", "--progress-bar", "off",
                 "--target", str(tmp), TRITON_PIN], f"installing {TRITON_PIN}", say)
        if not (tmp / BINARY).is_file():
            raise PreflightError(f"installing {TRITON_PIN}: pip finished but left no {BINARY} in {tmp}")
        (tmp / STAMP).write_text(f"{TRITON_PIN}\n")
        if target.exists():
            shutil.rmtree(target)
        try:
            os.replace(tmp, target)
        except OSError:
            if installed_home() is None:  # not another `ref install` finishing first
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    say(f"installed in {time.monotonic() - started:.1f} s")
    return target, True


def backend_dir(dest: Path) -> Path:
    """A backends dir with python/ = the wheel's python backend plus the stub for this interpreter."""
    src = wheel_root() / "pytriton" / "tritonserver"
    ver = f"{sys.version_info.major}.{sys.version_info.minor}"
    stub = src / "python_backend_stubs" / ver / "triton_python_backend_stub"
    if not stub.exists():
        raise PreflightError(f"the Triton wheel has no python backend stub for Python {ver}")
    py = dest / "python"
    py.mkdir(parents=True, exist_ok=True)
    for f in (src / "backends" / "python" / "libtriton_python.so",
              src / "backends" / "python" / "triton_python_backend_utils.py", stub):
        shutil.copy2(f, py / f.name)
    return dest


def model_repository(dest: Path, params: dict[str, str]) -> Path:
    """Copy the bundled repository to `dest`, with `params` (e.g. isolate_kv_cache=false) set in each config."""
    if dest.exists():
        shutil.rmtree(dest)
    shutil.copytree(MODEL_REPOSITORY, dest, ignore=shutil.ignore_patterns("__pycache__"))
    weights = init_weights()
    for cfg in dest.glob("*/config.pbtxt"):
        cfg.write_text(set_parameters(cfg.read_text(), params))
        save_weights(cfg.parent / "1" / WEIGHTS_FILE, weights)  # read at load time, like real model weights
    return dest


def set_parameters(text: str, params: dict[str, str]) -> str:
    for key, value in params.items():
        line = f'parameters {{ key: "{key}" value: {{ string_value: "{value}" }} }}'
        pattern = re.compile(rf'^parameters \{{ key: "{re.escape(key)}" .*$', re.MULTILINE)
        text = pattern.sub(line, text) if pattern.search(text) else text.rstrip("\n") + "\n" + line + "\n"
    return text


SHM_DIR = Path("/dev/shm")


def argv(repo: Path, backends: Path, host: str, http: int, grpc: int, metrics: int,
         shm_prefix: str = "") -> list[str]:
    """tritonserver's command line; on SIGTERM it waits at most EXIT_TIMEOUT_S for its models to unload (a
    model whose stub died never does: Triton's default 30 s outlasted `ref down`'s 15 s grace). `shm_prefix`
    names the python backend's shared-memory regions, so that those a SIGKILLed server left behind can be told
    apart and removed (remove_shm)."""
    prefix = ["--backend-config", f"python,shm-region-prefix-name={shm_prefix}"] if shm_prefix else []
    return [str(binary()), *prefix, "--model-repository", str(repo), "--backend-directory", str(backends),
            "--http-address", host, "--http-port", str(http), "--grpc-address", host, "--grpc-port", str(grpc),
            "--metrics-address", host, "--metrics-port", str(metrics), "--allow-gpu-metrics", "false",
            "--model-control-mode", "explicit", "--load-model", "*", "--log-verbose", "0",
            "--exit-timeout-secs", str(EXIT_TIMEOUT_S)]


def remove_shm(shm_prefix: str) -> int:
    """Delete the python backend's shared-memory regions named with this prefix (a server that exited cleanly
    removed its own; a SIGKILLed one cannot, and leaked regions break later servers' stubs); how many."""
    gone = 0
    for f in SHM_DIR.glob(f"{shm_prefix}*") if shm_prefix else ():
        f.unlink(missing_ok=True)
        gone += 1
    return gone


def env() -> dict[str, str]:
    """The stub must load this interpreter's libpython and the wheel's bundled libs, and import chaoskit (from
    where this process imports it) and numpy (from this interpreter's site-packages): it sees no venv of its own."""
    root = wheel_root()
    libdir = sysconfig.get_config_var("LIBDIR") or ""
    e = dict(os.environ)
    e["LD_LIBRARY_PATH"] = os.pathsep.join(p for p in (libdir, str(root / "nvidia_pytriton.libs"),
                                                       e.get("LD_LIBRARY_PATH", "")) if p)
    e["PATH"] = os.pathsep.join((str(Path(sys.executable).parent), e.get("PATH", "")))
    e["PYTHONPATH"] = os.pathsep.join(p for p in (str(package_parent()), *site_dirs(), e.get("PYTHONPATH", "")) if p)
    return e


def site_dirs() -> list[str]:
    """This interpreter's site-packages dirs, in its order (a venv's, one a .pth file adds, the system's when the
    venv has system site packages): where the stub finds numpy and chaoskit's other dependencies."""
    return [p for p in sys.path if Path(p).name in ("site-packages", "dist-packages") and Path(p).is_dir()]


def model_pids(server_pid: int) -> list[int]:
    """The python backend stubs a ready tritonserver runs for the bundled models (its children named STUB, each
    running <repository>/<model>/1/model.py), one per model in TRITON_MODELS' order; ChaoskitError otherwise."""
    by_model: dict[str, int] = {}
    try:
        children = psutil.Process(server_pid).children()
    except psutil.Error:
        children = []
    for child in children:
        try:
            if child.name() == STUB and len(argv := child.cmdline()) > 1:
                by_model[Path(argv[1]).parent.parent.name] = child.pid
        except psutil.Error:
            continue
    missing = [m for m in TRITON_MODELS if m not in by_model]
    if missing:
        raise ChaoskitError(f"tritonserver (pid {server_pid}) runs no {STUB} for {', '.join(missing)} "
                            f"(found {by_model or 'none'})")
    return [by_model[m] for m in TRITON_MODELS]
