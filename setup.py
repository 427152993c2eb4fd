"""The package list, which pyproject.toml cannot state: chaoskit's own packages as found, plus the bundled library,
whose folders at the top of the source tree ship as chaoskit.library.KIND ([tool.setuptools.package-dir])."""

from setuptools import find_namespace_packages, setup

LIBRARY = ("bpf", "experiments", "faults", "matrices", "probes")


def library_packages() -> list[str]:
    """chaoskit.library.KIND and one package per folder below it (experiments/sits2026/data and the like)."""
    return [f"chaoskit.library.{kind}{'.' + sub if sub else ''}"
            for kind in LIBRARY for sub in ("", *find_namespace_packages(kind))]


setup(packages=find_namespace_packages(include=["chaoskit*"]) + library_packages())
