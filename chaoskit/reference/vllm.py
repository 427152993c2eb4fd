"""The optional vLLM engine of the reference deployment (not installed by default)."""

from __future__ import annotations

import importlib.util

from chaoskit.errors import PreflightError


def check_installed() -> None:
    if importlib.util.find_spec("vllm") is None:
        raise PreflightError("vLLM is not installed in this environment; the vLLM engine is an optional extra "
                             "that is not built yet here; use --engine triton")


def start(*_args, **_kw):  # pragma: no cover - guarded by check_installed
    raise PreflightError("the vLLM engine is not available yet; use --engine triton")
