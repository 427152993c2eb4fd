"""Run a coroutine on uvloop when it is installed, else on asyncio's default loop."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any


def run_fast(coro: Coroutine[Any, Any, Any]) -> Any:
    try:
        import uvloop
    except ImportError:
        return asyncio.run(coro)
    return uvloop.run(coro)
