"""Run pip for `chaoskit ref install`: its progress lines as they come, its failure as one clear line."""

from __future__ import annotations

import os
import re
import subprocess
import tempfile
from collections import deque
from collections.abc import Callable
from pathlib import Path

from chaoskit.errors import PreflightError

# pip's lines worth showing as progress (the rest goes to the log only)
PROGRESS = ("Collecting ", "Downloading ", "Using cached ", "Installing collected packages", "Successfully installed")
# what pip (urllib3, requests) says when the index cannot be reached at all
UNREACHABLE = re.compile(r"NewConnectionError|Connection refused|Failed to establish a new connection|"
                         r"Name or service not known|Temporary failure in name resolution|Network is unreachable|"
                         r"No route to host|ConnectTimeout|Read timed out|ProxyError|SSLError|"
                         r"CERTIFICATE_VERIFY_FAILED")
TAIL_LINES = 3
TAIL_CHARS = 600


def run_pip(argv: list[str], what: str, say: Callable[[str], None], log: Path | None = None,
            env: dict[str, str] | None = None) -> None:
    """Run `argv` (a pip command), pass its progress lines to `say` and every line to `log`; PreflightError
    (one line, with the tail of pip's output) when it fails."""
    lines: deque[str] = deque(maxlen=200)
    with tempfile.NamedTemporaryFile("w+", prefix="chaoskit-pip-", suffix=".log") as debug:
        # pip's --log (as PIP_LOG) is verbose whatever the console says: it has the connection errors that
        # pip prints only with -v when it does not retry
        try:
            proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                    errors="replace", env={**(env or os.environ), "PIP_LOG": debug.name},
                                    stdin=subprocess.DEVNULL)
        except OSError as e:
            raise PreflightError(f"{what}: cannot run {argv[0]}: {e}") from None
        with open(log, "a") if log else open(os.devnull, "w") as sink:
            assert proc.stdout is not None
            for raw in proc.stdout:
                line = raw.rstrip()
                sink.write(raw)
                lines.append(line)
                if line.strip().startswith(PROGRESS):
                    say(f"  pip: {line.strip()}")
        if proc.wait() != 0:
            raise PreflightError(failure(what, proc.returncode, list(lines), debug.read().splitlines(), log))


def failure(what: str, rc: int, lines: list[str], debug: list[str] = (), log: Path | None = None) -> str:
    """One line: what failed, why (the index cannot be reached, or pip's exit status), pip's last errors."""
    errors = [line.strip() for line in lines if line.startswith("ERROR:")] or [line.strip() for line in lines
                                                                                if line.strip()]
    tail = " | ".join(errors[-TAIL_LINES:])[-TAIL_CHARS:]
    cause = next((m for line in (*lines, *debug) if (m := unreachable(line))), None)
    why = f"cannot reach the package index ({index_url()}: {cause}; pip exited {rc})" if cause else f"pip exited {rc}"
    return f"{what} failed: {why}: {tail or 'no output'}" + (f" (full output: {log})" if log else "")


def unreachable(line: str) -> str | None:
    """The network error in one of pip's lines ("[Errno 111] Connection refused"), if any."""
    m = UNREACHABLE.search(line)
    if m is None:
        return None
    errno_text = re.search(r"\[Errno -?\d+\] [^'\"()\]]+", line)
    return (errno_text.group(0) if errno_text else m.group(0)).split(" - ")[0].strip()


def index_url() -> str:
    """The index pip was pointed at, as far as the environment says (pip's config files may say more)."""
    url = os.environ.get("PIP_INDEX_URL")
    return f"PIP_INDEX_URL={url}" if url else "pypi.org or the index-url of your pip config; a proxy needs HTTPS_PROXY"


def pip_missing(python: str) -> str | None:
    """None when `python -m pip` works, else why not."""
    try:
        r = subprocess.run([python, "-m", "pip", "--version"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"{python} -m pip: {e}"
    if r.returncode != 0:
        return f"{python} has no pip ({(r.stderr.strip().splitlines() or ['?'])[-1]}): python -m ensurepip, or " \
               "install chaoskit with pipx / into a venv"
    return None
