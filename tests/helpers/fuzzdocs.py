"""Mutated experiment documents for fuzzing: the bundled experiments with lines deleted, duplicated,
re-indented, truncated, or values replaced by junk; and the check every one must pass."""

from __future__ import annotations

import random
from pathlib import Path

from chaoskit.errors import SpecError
from chaoskit.experiment.loader import load_experiment

ROOT = Path(__file__).resolve().parent.parent.parent
SEEDS = sorted((ROOT / "chaoskit" / "library" / "experiments").rglob("*.yaml"))
JUNK = ["", "-1", "0", "1e309", "NaN", "-5ms", "150%", "1.5.5", "'", '"', "[", "{", "}", "]", ":", "- x", "*a",
        "&a x", "!!python/object:os.system", "~", "null", "true", "0x10", "9" * 40, "é🙂", "{target.nope}",
        "{var.}", "{{}}", "\t", "%", "12GiB", "1e-9s", "SIGKILL", "network.nope", "\\x00"]


def mutate(text: str, rng: random.Random) -> str:
    lines = text.splitlines()
    for _ in range(rng.randint(1, 4)):
        if not lines:
            break
        i = rng.randrange(len(lines))
        op = rng.randrange(6)
        if op == 0:
            del lines[i]
        elif op == 1:
            lines.insert(i, lines[i])
        elif op == 2:
            lines[i] = " " * rng.randint(0, 6) + lines[i].lstrip()
        elif op == 3 and ":" in lines[i]:
            key = lines[i].split(":", 1)[0]
            lines[i] = f"{key}: {rng.choice(JUNK)}"
        elif op == 4:
            lines = lines[:i]
        else:
            lines[i] = lines[i][: rng.randrange(len(lines[i]) + 1)] + rng.choice(JUNK)
    return "\n".join(lines) + "\n"


def check_document(path: Path) -> str:
    """Load it as `chaoskit validate` does: 'ok' or 'invalid' (a SpecError, exit 2). Anything else raises:
    a crash the user would see as a traceback."""
    try:
        load_experiment(path, strict=False)
    except SpecError as e:
        assert str(e).strip(), "an empty error message"
        return "invalid"
    return "ok"
