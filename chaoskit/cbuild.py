"""The C sources chaoskit ships (the load sender, network.netem's queue helper), compiled with the system C
compiler into the cache once per source and flags; a newer build replaces the older ones atomically."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from chaoskit import paths
from chaoskit.errors import ChaoskitError


class NoCompiler(ChaoskitError):
    """No C compiler ($CC, cc or gcc on PATH)."""


class CompileFailed(ChaoskitError):
    """The compiler refused the source; the message is the end of its output."""


def compiler() -> str | None:
    """$CC, else cc, else gcc on PATH."""
    return os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")


def build(source: Path, stem: str, cflags: tuple[str, ...], suffix: str = "", libs: tuple[str, ...] = ()) -> Path:
    """`cache/<stem>-<hash of source and flags><suffix>`, compiled from `source` on first use."""
    key = hashlib.sha256(source.read_bytes() + " ".join(cflags).encode()).hexdigest()[:16]
    out = paths.cache_dir() / f"{stem}-{key}{suffix}"
    if out.exists():
        return out
    cc = compiler()
    if not cc:
        raise NoCompiler(f"no C compiler ($CC, cc or gcc on PATH) to build {source.name}")
    out.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=out.parent, prefix=f".{stem}-", suffix=suffix)
    os.close(fd)
    try:
        try:
            r = subprocess.run([cc, *cflags, "-o", tmp, str(source), *libs], capture_output=True, text=True)
        except OSError as e:  # $CC names no runnable program
            raise CompileFailed(f"compiling {source.name}: cannot run {cc}: {e.strerror}") from None
        if r.returncode:
            raise CompileFailed(f"compiling {source.name} failed ({cc}): {r.stderr.strip()[-600:]}")
        os.chmod(tmp, 0o755)
        os.replace(tmp, out)  # atomic: concurrent builders agree
        for old in out.parent.glob(f"{stem}-*{suffix}"):  # builds of earlier sources (a mapped one stays usable)
            if old != out:
                old.unlink(missing_ok=True)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return out
