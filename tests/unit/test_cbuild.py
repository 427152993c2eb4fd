"""cbuild: a shipped C source is compiled once into the cache, reused, replaced when the source changes; a
missing or failing compiler is a ChaoskitError saying so (never a traceback)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from chaoskit import cbuild, paths


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


def test_what_the_image_prebuilds_is_used_without_a_compiler_and_nothing_is_written(tmp_path, cache, monkeypatch):
    """deploy/k8s/chaoskit/Dockerfile builds the shipped helpers into CHAOSKIT_CACHE_DIR in a stage with gcc; the
    helper pods then have no compiler and a read-only root filesystem: each build() must find its prebuilt file."""
    if cbuild.compiler() is None:
        pytest.skip("no C compiler ($CC, cc or gcc) here")
    from chaoskit.gpu import cuda_fault_ctl
    from chaoskit.injectors.netem import nfqueue as netem_queue
    from chaoskit.load import native
    from chaoskit.paths import package_parent

    builds = (netem_queue.build, native.build, cuda_fault_ctl.build)
    prebuilt = [b() for b in builds]
    listing = sorted((p.name, p.stat().st_mtime_ns) for p in cache.iterdir())
    monkeypatch.setenv("CC", str(tmp_path / "no-such-cc"))
    monkeypatch.setenv("PATH", str(tmp_path))
    assert [b() for b in builds] == prebuilt
    assert sorted((p.name, p.stat().st_mtime_ns) for p in cache.iterdir()) == listing
    dockerfile = (package_parent() / "deploy/k8s/chaoskit/Dockerfile").read_text()
    assert 'netem_queue.build(), native.build()' in dockerfile and "ENV CHAOSKIT_CACHE_DIR=" in dockerfile


def test_a_test_session_builds_into_its_own_cache_never_the_users(tmp_path_factory):
    """tests/conftest.py's own_caches: chaoskit's cache and every XDG cache of this session are in its temporary
    directory, never ~/.cache, for the tests and the processes they start."""
    home_cache = Path.home() / ".cache"
    for path in (paths.cache_dir(), Path(os.environ["XDG_CACHE_HOME"])):
        assert not path.is_relative_to(home_cache) and path.is_relative_to(tmp_path_factory.getbasetemp()), path
    child = subprocess.run([sys.executable, "-c", "from chaoskit import paths; print(paths.cache_dir())"],
                           capture_output=True, text=True, check=True).stdout.strip()
    assert Path(child) == paths.cache_dir()
