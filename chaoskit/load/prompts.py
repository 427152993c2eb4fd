"""Prompts of a stated length in tokens, from a built-in synthetic corpus (no download) or a file."""

from __future__ import annotations

import random
from pathlib import Path

from chaoskit.errors import ChaoskitError

_WORDS = ("latency throughput cache batch token model server replica gateway request stream queue memory "
          "kernel packet retry timeout budget shard tensor layer prompt decode prefill schedule fault probe "
          "service health signal window percentile steady state hypothesis rollback ledger watchdog").split()


def synthetic(tokens: int, seed: int) -> str:
    """About `tokens` tokens: one word plus a space is close to one token for BPE tokenizers, and the
    byte-level tiny_lm sees ~7 bytes per word; callers that need exact counts use `exact_bytes`."""
    rng = random.Random(seed)
    return " ".join(rng.choice(_WORDS) for _ in range(max(1, tokens)))


def exact_bytes(tokens: int, seed: int) -> str:
    """Exactly `tokens` bytes (tokens of a byte-level model such as the reference tiny_lm)."""
    return synthetic(tokens, seed)[:tokens].ljust(tokens, ".")


def from_file(path: str) -> list[str]:
    try:
        prompts = [ln.rstrip("\n") for ln in Path(path).read_text().splitlines() if ln.strip()]
    except OSError as e:
        raise ChaoskitError(f"prompts file {path}: {e.strerror}") from None
    if not prompts:
        raise ChaoskitError(f"prompts file {path}: no prompts")
    return prompts
