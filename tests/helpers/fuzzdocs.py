"""Mutated experiment documents for fuzzing: the bundled experiments with lines deleted, duplicated,
re-indented, truncated, or values replaced by junk; and the check every one must pass."""

from __future__ import annotations

import random
import re
from pathlib import Path

from chaoskit.errors import SpecError
from chaoskit.experiment.loader import LINT_FAILED, load_experiment

ROOT = Path(__file__).resolve().parent.parent.parent
SEEDS = sorted((ROOT / "experiments").rglob("*.yaml"))
JUNK = ["", "-1", "0", "1e309", "NaN", "-5ms", "150%", "1.5.5", "'", '"', "[", "{", "}", "]", ":", "- x", "*a",
        "&a x", "!!python/object:os.system", "~", "null", "true", "0x10", "9" * 40, "é🙂", "{target.nope}",
        "{var.}", "{{}}", "\t", "%", "12GiB", "1e-9s", "SIGKILL", "network.nope", "\\x00",
        # placeholders and addresses gone wrong, bare numbers where a duration goes
        "{!ar.proxy_port}", "http://127.0.0.1:{!ar.proxy_port}/v1", "127.0.0.1:{x", "http://[::1", ":99999",
        "http://h:0x50/", "{target.gateway_port}", "200", "0.5", ".inf", "-.inf", ".nan", "1e3"]


def mutate(text: str, rng: random.Random) -> str:
    lines = text.splitlines()
    for _ in range(rng.randint(1, 4)):
        if not lines:
            break
        i = rng.randrange(len(lines))
        op = rng.randrange(8)
        if op == 6:  # the values people get subtly wrong: a placeholder, a port, a duration's unit
            lines[i] = _subtly_wrong(lines[i], rng)
        elif op == 7:  # pick a line where such a value is
            hits = [j for j, line in enumerate(lines) if _SUBTLE.search(line)]
            if hits:
                j = rng.choice(hits)
                lines[j] = _subtly_wrong(lines[j], rng)
        elif op == 0:
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


_SUBTLE = re.compile(r"\{[A-Za-z_][\w.\-\[\]]*\}|:\d+\b|\b\d+(?:\.\d+)?(?:us|ms|s|m|h)\b")
_PLACEHOLDER_SLIPS = ["{!", "{ ", "{{", "{-", "{0", "{target.", "{var."]


def _subtly_wrong(line: str, rng: random.Random) -> str:
    """One placeholder, port or duration in `line` made subtly wrong: `{!ar.x}`, `:{!ar.port}` or `:8o8o` for a
    port, a duration without its unit."""
    hits = list(_SUBTLE.finditer(line))
    if not hits:
        return line
    m = rng.choice(hits)
    text = m.group(0)
    if text.startswith("{"):
        new = rng.choice(_PLACEHOLDER_SLIPS) + text[1:]
    elif text.startswith(":"):
        new = ":" + rng.choice(["{!ar.proxy_port}", "{target.gateway_port}", "8o8o", "99999", "", "{x", "-1"])
    else:
        new = re.sub(r"[a-z]+$", "", text)
    return line[: m.start()] + new + line[m.end():]


def check_document(path: Path) -> str:
    """Load it as `chaoskit validate` does, warnings included: 'ok' or 'invalid' (a SpecError, exit 2). Anything
    else raises: a crash the user would see as a traceback (or, from the lint, as a warning that it failed)."""
    try:
        loaded = load_experiment(path, strict=False)
    except SpecError as e:
        assert str(e).strip(), "an empty error message"
        return "invalid"
    failed = [w for w in loaded.warnings if LINT_FAILED in w]
    assert not failed, f"the lint crashed: {failed[0]}"
    return "ok"
