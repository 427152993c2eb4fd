"""Skips cannot make CI green: with the environment variable CI set, a skip whose reason matches no pattern of
tests/skips-allowed.txt fails the run (exit 1), each unexpected skip listed at the end. Without CI they are
listed too, as a warning. tests/conftest.py re-exports pytest_configure, which registers the plugin
(SkipGuard).

tests/skips-allowed.txt: one allowed reason a line, `REGEX -> WHY` (WHY: why a host may lack what the test needs),
the REGEX matched against the whole reason (re.fullmatch; `.*` where the reason goes on with host details).
Lines starting with # and blank lines are ignored. $CHAOSKIT_SKIPS_ALLOWED names another file (tests of this)."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

import pytest

ALLOWED = Path(__file__).resolve().parent.parent / "skips-allowed.txt"
SEPARATOR = " -> "


@dataclass
class Allowed:
    pattern: re.Pattern[str]
    why: str
    line: int


def in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")


def load(path: Path) -> list[Allowed]:
    """The allow-list; a malformed line (no ` -> WHY`, an empty why, a regex that does not compile) is an error."""
    out = []
    for n, raw in enumerate(path.read_text().splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        pattern, sep, why = line.partition(SEPARATOR)
        if not sep or not why.strip() or not pattern.strip():
            raise pytest.UsageError(f"{path}:{n}: expected 'REGEX{SEPARATOR}WHY', got {raw!r}")
        try:
            out.append(Allowed(re.compile(pattern.strip(), re.DOTALL), why.strip(), n))
        except re.error as e:
            raise pytest.UsageError(f"{path}:{n}: not a regular expression: {e}") from None
    return out


def reason_of(report: pytest.TestReport | pytest.CollectReport) -> str:
    """The reason a skipped report gives (pytest.skip() calls prefix it with 'Skipped: ', marks do not)."""
    longrepr = report.longrepr
    text = longrepr[2] if isinstance(longrepr, tuple) and len(longrepr) == 3 else str(longrepr)
    return text.removeprefix("Skipped: ")


class SkipGuard:
    """The plugin: collects every skip's reason, fails a CI run on one the allow-list does not name."""

    def __init__(self, config: pytest.Config):
        self.config = config
        self.path = Path(os.environ.get("CHAOSKIT_SKIPS_ALLOWED") or ALLOWED)
        self.allowed = load(self.path)
        self.unexpected: list[tuple[str, str]] = []  # (test or collector id, reason)

    def _check(self, report: pytest.TestReport | pytest.CollectReport) -> None:
        if not report.skipped or hasattr(report, "wasxfail"):
            return
        reason = reason_of(report)
        if not any(a.pattern.fullmatch(reason) for a in self.allowed):
            self.unexpected.append((report.nodeid, reason))

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        self._check(report)

    def pytest_collectreport(self, report: pytest.CollectReport) -> None:
        self._check(report)

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        if self.unexpected and in_ci() and session.exitstatus in (pytest.ExitCode.OK,
                                                                    pytest.ExitCode.NO_TESTS_COLLECTED):
            session.exitstatus = pytest.ExitCode.TESTS_FAILED

    def pytest_terminal_summary(self, terminalreporter) -> None:
        if not self.unexpected:
            return
        ci = in_ci()
        terminalreporter.section("skips not in the allow-list", sep="=", red=ci, yellow=not ci)
        for nodeid, reason in self.unexpected:
            terminalreporter.line(f"UNEXPECTED SKIP {nodeid}: {reason}")
        n = len(self.unexpected)
        if ci:
            terminalreporter.line(f"CI is set: {n} skip(s) whose reason matches no line of {self.path} fail the "
                                  "run (give the host what it lacks, or add 'REGEX -> why a host may lack it' "
                                  "there)", red=True)
        else:
            terminalreporter.line(f"{n} skip(s) match no line of {self.path}: with CI set the run would fail",
                                  yellow=True)


def pytest_configure(config: pytest.Config) -> None:
    if not config.pluginmanager.has_plugin("chaoskit-skipguard"):
        config.pluginmanager.register(SkipGuard(config), "chaoskit-skipguard")
