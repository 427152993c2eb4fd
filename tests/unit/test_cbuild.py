"""cbuild: a shipped C source is compiled once into the cache, reused, replaced when the source changes; a
missing or failing compiler is a ChaoskitError saying so (never a traceback)."""

from __future__ import annotations

import subprocess

import pytest

from chaoskit import cbuild


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("CHAOSKIT_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


def test_built_once_reused_and_replaced_when_the_source_changes(tmp_path, cache):
    if cbuild.compiler() is None:
        pytest.skip("no C compiler ($CC, cc or gcc) here")
    src = tmp_path / "hello.c"
    src.write_text('#include <stdio.h>\nint main(void) { puts("one"); return 0; }\n')
    first = cbuild.build(src, "hello", ("-O2",))
    assert first.parent == cache and subprocess.run([first], capture_output=True, text=True).stdout == "one\n"
    mtime = first.stat().st_mtime_ns
    assert cbuild.build(src, "hello", ("-O2",)) == first and first.stat().st_mtime_ns == mtime
    src.write_text('#include <stdio.h>\nint main(void) { puts("two"); return 0; }\n')
    second = cbuild.build(src, "hello", ("-O2",))
    assert second != first and not first.exists() and sorted(p.name for p in cache.iterdir()) == [second.name]
    assert subprocess.run([second], capture_output=True, text=True).stdout == "two\n"


def test_a_missing_or_failing_compiler_says_so(tmp_path, cache, monkeypatch):
    src = tmp_path / "bad.c"
    src.write_text("int main(void) { return syntax error; }\n")
    monkeypatch.setenv("CC", str(tmp_path / "no-such-cc"))
    with pytest.raises(cbuild.CompileFailed, match="cannot run .*no-such-cc"):
        cbuild.build(src, "bad", ())
    monkeypatch.delenv("CC")
    monkeypatch.setenv("PATH", str(tmp_path))  # no cc, no gcc
    with pytest.raises(cbuild.NoCompiler, match="no C compiler"):
        cbuild.build(src, "bad", ())
    monkeypatch.undo()
    monkeypatch.setenv("CHAOSKIT_CACHE_DIR", str(cache))
    if cbuild.compiler() is not None:
        with pytest.raises(cbuild.CompileFailed, match="compiling bad.c failed"):
            cbuild.build(src, "bad", ())
    assert not cache.exists() or [p.name for p in cache.iterdir()] == []  # no partial build left
