"""chaoskit: chaos engineering and fault injection for LLM inference services."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("chaoskit")  # the installed distribution's metadata (pyproject.toml [project] version)
except PackageNotFoundError:  # imported from a source tree that was never installed
    __version__ = "0+unknown"
