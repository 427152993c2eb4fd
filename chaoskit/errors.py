"""Exceptions the user can act on, each carrying the exit code the CLI returns."""

from __future__ import annotations

EXIT_HELD = 0
EXIT_DEVIATED = 1
EXIT_INVALID = 2
EXIT_ABORTED = 3
EXIT_PREFLIGHT = 4
EXIT_ROLLBACK_INCOMPLETE = 5
EXIT_SIGINT = 130
EXIT_SIGTERM = 143


class ChaoskitError(Exception):
    """Base of errors shown to the user as one clear message (never a traceback)."""

    exit_code = EXIT_INVALID


class SpecError(ChaoskitError):
    """The experiment file (or a CLI argument) is invalid; nothing was applied."""

    exit_code = EXIT_INVALID

    def __init__(self, problems: list[str] | str):
        self.problems = [problems] if isinstance(problems, str) else list(problems)
        super().__init__("\n".join(self.problems))


class PreflightError(ChaoskitError):
    """This host cannot do what was asked (missing module, not root, unsafe size)."""

    exit_code = EXIT_PREFLIGHT
