"""`tiny-mcp`: a small MCP tool server (streamable HTTP at /mcp, the official `mcp` SDK) beside the reference,
whose tools answer deterministically - the same arguments, the same answer - and which logs every tool call it
serves (the independent count). Its tools are the ones tiny-openai's tool calls name when a prompt asks:
get_weather(city, days), get_time(zone) and slow_lookup(key, seconds) (answers after `seconds`, at most 60); their
answers are the agent probe's local tools' (chaoskit.probes.agent_tools)."""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import time
from pathlib import Path
from typing import Any, TextIO

from chaoskit.probes.agent_tools import clock, lookup, weather

MAX_SLOW_S = 60.0


class Calls:
    """The request log: a JSON line per tool call (when it came and ended, the tool, its arguments' key, the
    outcome), and the count /stats gives."""

    def __init__(self, name: str, log: TextIO | None):
        self.name, self.log, self.served = name, log, 0

    def record(self, tool: str, args: dict[str, Any], t0: float, outcome: str) -> None:
        self.served += 1
        if self.log is not None:
            key = hashlib.sha256(json.dumps(args, sort_keys=True).encode()).hexdigest()[:16]
            self.log.write(json.dumps({"server": self.name, "t0": t0, "t1": time.time(), "tool": tool,
                                       "arguments": key, "outcome": outcome}) + "\n")
            self.log.flush()


def server(calls: Calls) -> Any:
    """The MCP server (mcp.server.mcpserver.MCPServer) with its tools, /health and /stats."""
    from mcp.server.mcpserver import MCPServer
    from starlette.requests import Request
    from starlette.responses import JSONResponse, Response

    mcp = MCPServer(name="tiny-mcp", version="1", log_level="WARNING")

    def logged(tool: str, args: dict[str, Any], answer: str, t0: float) -> str:
        calls.record(tool, args, t0, "complete")
        return answer

    @mcp.tool(description="the weather in a city for some days")
    def get_weather(city: str, days: int = 1) -> str:
        return logged("get_weather", {"city": city, "days": days}, weather(city, days), time.time())

    @mcp.tool(description="the time in a time zone")
    def get_time(zone: str = "UTC") -> str:
        return logged("get_time", {"zone": zone}, clock(zone), time.time())

    @mcp.tool(description="a value looked up slowly: answers after `seconds` (at most 60)")
    async def slow_lookup(key: str, seconds: float = 1.0) -> str:
        t0 = time.time()
        try:
            await asyncio.sleep(min(max(seconds, 0.0), MAX_SLOW_S))
        except asyncio.CancelledError:
            calls.record("slow_lookup", {"key": key, "seconds": seconds}, t0, "cancelled")
            raise
        return logged("slow_lookup", {"key": key, "seconds": seconds}, lookup(key), t0)

    @mcp.custom_route("/health", methods=["GET"])
    async def health(_: Request) -> Response:
        return Response("")

    @mcp.custom_route("/stats", methods=["GET"])
    async def stats(_: Request) -> Response:
        return JSONResponse({"name": calls.name, "served": calls.served})

    return mcp


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m chaoskit.reference.tiny_mcp", description=__doc__)
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--name", default="tiny-mcp")
    ap.add_argument("--log", type=Path, help="append a JSON line per tool call here")
    a = ap.parse_args(argv)
    import uvicorn

    log = open(a.log, "a", buffering=1) if a.log else None
    try:
        app = server(Calls(a.name, log)).streamable_http_app(host=a.host)
        uvicorn.run(app, host=a.host, port=a.port, log_level="warning", access_log=False)
    finally:
        if log:
            log.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
