"""tests/helpers/skipguard.py: with CI set, a skip whose reason tests/skips-allowed.txt does not allow fails the run;
and pytest-timeout (pyproject.toml) cuts a test that hangs, naming it. Each runs a small pytest session of its own
(pytester, in a subprocess)."""

from __future__ import annotations

import re

import pytest

from tests.conftest import ROOT
from tests.helpers import skipguard

pytest_plugins = ["pytester"]

TESTS = '''
import pytest

def test_runs():
    pass

def test_lacks_a_tool():
    pytest.skip("no frobnicator on this host")

@pytest.mark.skipif(True, reason="this host has a GPU")
def test_marked():
    pass
'''


@pytest.fixture
def session(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch):
    """run(ci, allowed lines) -> the result of a pytest session of TESTS with the plugin and that allow-list."""
    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    pytester.makepyfile(test_some=TESTS)

    def run(ci: str | None, allowed: str, *args: str) -> pytest.RunResult:
        (pytester.path / "allowed.txt").write_text(allowed)
        monkeypatch.setenv("CHAOSKIT_SKIPS_ALLOWED", str(pytester.path / "allowed.txt"))
        if ci is None:
            monkeypatch.delenv("CI", raising=False)
        else:
            monkeypatch.setenv("CI", ci)
        return pytester.runpytest_subprocess("-p", "tests.helpers.skipguard", "-p", "no:cacheprovider", "-rs",
                                             *args)
    return run


BOTH = "no frobnicator on this host -> a host may lack it\nthis host has a .* -> the no-GPU path\n"


def test_with_ci_set_an_unexpected_skip_fails_the_run(session):
    r = session("1", "this host has a .* -> the no-GPU path\n")
    print(r.stdout.str())
    r.assert_outcomes(passed=1, skipped=2)
    assert r.ret == pytest.ExitCode.TESTS_FAILED
    assert "UNEXPECTED SKIP test_some.py::test_lacks_a_tool: no frobnicator on this host" in r.stdout.str()
    assert "test_marked" not in r.stdout.str().split("skips not in the allow-list")[1]
    assert re.search(r"CI is set: 1 skip\(s\) whose reason matches no line of .*allowed.txt fail the run",
                     r.stdout.str())


def test_allowed_skips_or_no_ci_leave_the_run_green(session):
    assert session("true", BOTH).ret == pytest.ExitCode.OK  # every reason allowed
    r = session(None, "")  # without CI: listed as a warning only
    assert r.ret == pytest.ExitCode.OK and r.stdout.str().count("UNEXPECTED SKIP") == 2
    assert "with CI set the run would fail" in r.stdout.str()
    assert session("0", "").ret == pytest.ExitCode.OK


def test_the_pattern_matches_the_whole_reason(session):
    # "no frobnicator" alone matches only the start of the reason: not enough
    assert session("1", "no frobnicator -> x\nthis host has a .* -> y\n").ret == pytest.ExitCode.TESTS_FAILED


def test_a_failing_run_stays_failed_and_a_module_skip_counts(session, pytester):
    pytester.makepyfile(test_more='import pytest\npytest.importorskip("no_such_module_here")\n',
                        test_fails="def test_no():\n    assert False\n")
    r = session("1", BOTH)
    assert r.ret == pytest.ExitCode.TESTS_FAILED
    assert "UNEXPECTED SKIP test_more.py: could not import 'no_such_module_here'" in r.stdout.str()


def test_malformed_allow_list_lines_are_refused(tmp_path):
    for text, why in (("just a pattern\n", "expected 'REGEX -> WHY'"), ("a( -> b\n", "not a regular expression"),
                      ("x ->   \n", "expected 'REGEX -> WHY'")):
        (tmp_path / "a.txt").write_text(text)
        with pytest.raises(pytest.UsageError, match=re.escape(why)):
            skipguard.load(tmp_path / "a.txt")


def test_the_allow_list_gives_a_why_for_each_reason_and_allows_nothing_setup_provides():
    allowed = skipguard.load(skipguard.ALLOWED)
    assert allowed and all(len(a.why) > 10 for a in allowed)

    def ok(reason: str) -> bool:
        return any(a.pattern.fullmatch(reason) for a in allowed)

    assert ok("network.netem runs here (sch_netem or queue mode)")  # this host's one skip
    assert ok("not the host this test is for (absent: [], packaged kernel: True)")
    for reason in ("needs root", "no C compiler ($CC, cc or gcc) here", "node is not installed (ajv runs on node)",
                   "eBPF unavailable: no kernel headers at /lib/modules/6.1/build", "Triton not installed: x",
                   "vLLM not installed in /x (make vllm)", "not the host this test is for (absent: ['gcc'], "
                   "packaged kernel: True)", "no cgroup hierarchy with the io controller is mounted (/proc/mounts)",
                   "queue mode cannot run here: no C compiler", "promtool (Debian's prometheus package) not here"):
        assert not ok(reason), reason


def test_a_hanging_test_is_cut_by_its_timeout_and_named(pytester: pytest.Pytester, monkeypatch):
    """pytest-timeout (a dev dependency) with its ini option, here 2 s: the test that hangs fails, named, and the
    next one runs."""
    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    pytester.makepyfile(test_hang="import time\n\ndef test_forever():\n    time.sleep(600)\n\n"
                                  "def test_after():\n    pass\n")
    r = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-o", "timeout=2", timeout=60)
    out = r.stdout.str()
    print(out)
    r.assert_outcomes(passed=1, failed=1)
    assert "FAILED test_hang.py::test_forever - Failed: Timeout (>2.0s) from pytest-timeout." in out


def test_every_test_has_a_timeout(pytestconfig: pytest.Config):
    assert pytestconfig.pluginmanager.has_plugin("timeout")
    assert float(pytestconfig.getini("timeout")) == 300
