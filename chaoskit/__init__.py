"""chaoskit: chaos engineering and fault injection for LLM inference services."""

from __future__ import annotations

from functools import cache


def __getattr__(name: str) -> str:
    """`__version__`, read from the installed distribution's metadata on first use only: importlib.metadata
    costs ~35 ms, which every helper process (a proxy, a holder) would pay at start for nothing."""
    if name == "__version__":
        return _version()
    raise AttributeError(f"module 'chaoskit' has no attribute {name!r}")


@cache
def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("chaoskit")  # the installed distribution's metadata (pyproject.toml [project] version)
    except PackageNotFoundError:  # imported from a source tree that was never installed
        return "0+unknown"
