"""Find the real `tritonserver` shipped in the nvidia-pytriton wheel and build its backend dir, argv and env."""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import sys
import sysconfig
from pathlib import Path

from chaoskit.errors import PreflightError
from chaoskit.paths import package_parent
from chaoskit.reference.tinylm import WEIGHTS_FILE, init_weights, save_weights

MODEL_REPOSITORY = Path(__file__).resolve().parent / "model_repository"
INSTALL_HINT = "pip install --no-deps nvidia-pytriton==0.7.0 (make setup does it)"


def wheel_root() -> Path:
    """site-packages dir holding pytriton/ and nvidia_pytriton.libs/ (without importing pytriton)."""
    spec = importlib.util.find_spec("pytriton")
    if spec is None or not spec.submodule_search_locations:
        raise PreflightError(f"Triton is not installed in this environment; {INSTALL_HINT}")
    root = Path(next(iter(spec.submodule_search_locations))).parent
    if not (root / "pytriton" / "tritonserver" / "bin" / "tritonserver").exists():
        raise PreflightError(f"no tritonserver binary under {root / 'pytriton'}; {INSTALL_HINT}")
    return root


def binary() -> Path:
    return wheel_root() / "pytriton" / "tritonserver" / "bin" / "tritonserver"


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


def argv(repo: Path, backends: Path, host: str, http: int, grpc: int, metrics: int) -> list[str]:
    return [str(binary()), "--model-repository", str(repo), "--backend-directory", str(backends),
            "--http-address", host, "--http-port", str(http), "--grpc-address", host, "--grpc-port", str(grpc),
            "--metrics-address", host, "--metrics-port", str(metrics), "--allow-gpu-metrics", "false",
            "--model-control-mode", "explicit", "--load-model", "*", "--log-verbose", "0"]


def env() -> dict[str, str]:
    """The stub must load this interpreter's libpython and the wheel's bundled libs, and import chaoskit (from
    where this process imports it) and numpy (from the wheel's site-packages): it sees no venv of its own."""
    root = wheel_root()
    libdir = sysconfig.get_config_var("LIBDIR") or ""
    e = dict(os.environ)
    e["LD_LIBRARY_PATH"] = os.pathsep.join(p for p in (libdir, str(root / "nvidia_pytriton.libs"),
                                                       e.get("LD_LIBRARY_PATH", "")) if p)
    e["PATH"] = os.pathsep.join((str(Path(sys.executable).parent), e.get("PATH", "")))
    e["PYTHONPATH"] = os.pathsep.join(p for p in (str(package_parent()), str(root), e.get("PYTHONPATH", "")) if p)
    return e
