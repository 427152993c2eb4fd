"""Parse human units: durations (15ms, 2s), sizes (512MiB, 40%), percentages (0.2%)."""

from __future__ import annotations

import re

_DURATION_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(us|µs|ms|s|m|h)?\s*$")
_DURATION_UNITS = {"us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0, None: 1.0}

_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGT]i?B?|B)?\s*$", re.IGNORECASE)
_SIZE_UNITS = {
    "": 1, "b": 1,
    "k": 1000, "kb": 1000, "kib": 1024, "ki": 1024,
    "m": 1000**2, "mb": 1000**2, "mib": 1024**2, "mi": 1024**2,
    "g": 1000**3, "gb": 1000**3, "gib": 1024**3, "gi": 1024**3,
    "t": 1000**4, "tb": 1000**4, "tib": 1024**4, "ti": 1024**4,
}
_PERCENT_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*%\s*$")
_BITRATE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?)bit\s*$", re.IGNORECASE)
_BITRATE_UNITS = {"": 1, "k": 1e3, "m": 1e6, "g": 1e9, "t": 1e12}


def parse_duration(value: object) -> float:
    """Return seconds. A bare number is seconds here (Python callers, JSON written by chaoskit itself); the
    experiment loader refuses one other than 0 (see `bare_duration`). Negative, infinite or malformed values
    raise ValueError."""
    if isinstance(value, bool):
        raise ValueError("expected a duration like '15ms' or '2s'")
    if isinstance(value, (int, float)):
        if value != value or value in (float("inf"), float("-inf")):
            raise ValueError(f"expected a duration like '15ms' or '2s' (got {value!r})")
        if value < 0:
            raise ValueError("a duration cannot be negative")
        return float(value)
    if isinstance(value, str):
        if value.strip().startswith("-"):
            raise ValueError(f"a duration cannot be negative (got '{value}')")
        m = _DURATION_RE.match(value)
        if m:
            return float(m.group(1)) * _DURATION_UNITS[m.group(2)]
    raise ValueError(f"expected a duration like '15ms' or '2s' (got {value!r})")


def bare_duration(value: object) -> str | None:
    """The number as written when `value` is a duration without a unit other than zero (`200`, `1.5`, `"200"`),
    else None. Such a value is ambiguous in a file a person wrote (`delay: 200` meant as milliseconds was
    200 s), so the loader refuses it, naming both readings."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return str(value) if value else None
    if isinstance(value, float):
        return f"{value:g}" if value else None
    if isinstance(value, str) and (m := _DURATION_RE.match(value)) and m.group(2) is None:
        return m.group(1) if float(m.group(1)) else None
    return None


def format_percent(fraction: float) -> str:
    """A fraction as the percentage parse_percent reads back to it: 0.002 -> '0.2%', 1.0 -> '100%'."""
    return f"{fraction * 100:.10f}".rstrip("0").rstrip(".") + "%"


def parse_percent(value: object) -> float:
    """Return a fraction in [0, 1] from '0.2%' or a bare number of percent."""
    if isinstance(value, bool):
        raise ValueError("expected a percentage like '0.2%'")
    if isinstance(value, (int, float)):
        pct = float(value)
    elif isinstance(value, str) and (m := _PERCENT_RE.match(value)):
        pct = float(m.group(1))
    elif isinstance(value, str) and value.strip().startswith("-"):
        raise ValueError(f"a percentage cannot be negative (got '{value}')")
    else:
        raise ValueError(f"expected a percentage like '0.2%' (got {value!r})")
    if not 0.0 <= pct <= 100.0:
        raise ValueError(f"a percentage must be between 0% and 100% (got {pct:g}%)")
    return pct / 100.0


def parse_size(value: object, total: int | None = None) -> int:
    """Return bytes from '512MiB', '1G', 1048576, or '40%' (of `total`)."""
    if isinstance(value, bool):
        raise ValueError("expected a size like '512MiB' or '40%'")
    if isinstance(value, int):
        if value < 0:
            raise ValueError("a size cannot be negative")
        return value
    if isinstance(value, str):
        if value.strip().startswith("-"):
            raise ValueError(f"a size cannot be negative (got '{value}')")
        if _PERCENT_RE.match(value):
            frac = parse_percent(value)
            if total is None:
                raise ValueError("a percentage size needs a known total")
            return int(frac * total)
        m = _SIZE_RE.match(value)
        if m:
            unit = (m.group(2) or "").lower()
            return int(float(m.group(1)) * _SIZE_UNITS[unit])
    raise ValueError(f"expected a size like '512MiB' or '40%' (got {value!r})")


def parse_rate(value: object) -> int:
    """Return bytes per second from '8mbit' (bits, tc style), '1MiB/s' / '1MB' (bytes) or a bare byte count."""
    if isinstance(value, str) and (m := _BITRATE_RE.match(value)):
        n = int(float(m.group(1)) * _BITRATE_UNITS[m.group(2).lower()] / 8)
    else:
        text = value.strip().removesuffix("/s") if isinstance(value, str) else value
        try:
            n = parse_size(text)
        except ValueError:
            raise ValueError(f"expected a rate like '8mbit' or '1MiB/s' (got {value!r})") from None
    if n <= 0:
        raise ValueError(f"a rate must be positive (got {value!r})")
    return n


def is_percent(value: object) -> bool:
    return isinstance(value, str) and bool(_PERCENT_RE.match(value))


def format_size(n: int) -> str:
    for unit, mult in (("GiB", 1024**3), ("MiB", 1024**2), ("KiB", 1024)):
        if n >= mult:
            return f"{n / mult:.1f}{unit}"
    return f"{n}B"
