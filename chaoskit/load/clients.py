"""One request of each API, timed: OpenAI completions/chat (streaming SSE or not), Triton KServe v2 infer
or generate_stream, plain HTTP. Returns the first-token time, token times and the error class (the kinds are
recorder.ERROR_KINDS: an answer that is not a success says how it failed - a truncated, stalled or malformed
stream, an error object in a 200, a 429 with or without Retry-After, a 503 with Retry-After ...)."""

from __future__ import annotations

import asyncio
import json
import re
import time
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from chaoskit.errors import ChaoskitError

APIS = ("openai", "openai-chat", "triton", "http")


@dataclass
class Outcome:
    error: str | None = None  # one of recorder.ERROR_KINDS
    token_times: list[float] = field(default_factory=list)  # time.monotonic() of each token event
    tokens: int = 0
    status: int = 0
    usage_tokens: int | None = None  # the server's own count, when it sends one
    group: str | None = None  # group_by: the response header's value (None: no response head, or no header)


class MalformedEvent(ValueError):
    """A line of an SSE stream that is no SSE field, or a data payload that is neither a JSON object nor [DONE]."""


def status_error(status: int, retry_after: bool) -> str:
    """The error kind of an HTTP status >= 400 (retry_after: the answer had a Retry-After header)."""
    if status == 429:
        return "rate_limited_retry_after" if retry_after else "rate_limited"
    if status == 503 and retry_after:
        return "unavailable_retry_after"
    return "http_status"


_ERROR_BODY = re.compile(rb'^\s*\{\s*"(?:error"\s*:|object"\s*:\s*"error")')


def error_body(head: bytes) -> bool:
    """Does a 200 answer's JSON body (its first bytes) hold an error object instead of a result?"""
    return _ERROR_BODY.match(head) is not None


def needs_done(api: str) -> bool:
    """OpenAI streams end with `data: [DONE]` (Triton's end with the body: the final chunk)."""
    return api in ("openai", "openai-chat")


def _usage(stream: bool) -> dict[str, Any]:
    return {"stream_options": {"include_usage": True}} if stream else {}


def request_for(api: str, url: str, model: str | None, prompt: str, max_tokens: int, stream: bool,
                method: str = "GET", body: Any = None) -> tuple[str, str, Any]:
    """(method, full URL, JSON body or None)."""
    base = url.rstrip("/")
    if api == "openai":
        return "POST", f"{base}/v1/completions", {"model": model, "prompt": prompt, "max_tokens": max_tokens,
                                                   "stream": stream, "ignore_eos": True, **_usage(stream)}
    if api == "openai-chat":
        return "POST", f"{base}/v1/chat/completions", {"model": model, "max_tokens": max_tokens, "stream": stream,
                                                        "messages": [{"role": "user", "content": prompt}],
                                                        **_usage(stream)}
    if api == "triton":
        name = model or "tiny_lm"
        if stream:
            return "POST", f"{base}/v2/models/{name}/generate_stream", {"text_input": prompt, "max_tokens": max_tokens}
        return "POST", f"{base}/v2/models/{name}/infer", {"inputs": [
            {"name": "text_input", "datatype": "BYTES", "shape": [1, 1], "data": [prompt]},
            {"name": "max_tokens", "datatype": "INT32", "shape": [1, 1], "data": [max_tokens]}]}
    if api == "http":
        return method, url, body
    raise ChaoskitError(f"unknown api {api!r}: {', '.join(APIS)}")


# a non-empty token text is one token (a choice of an event); the regex counts a whole block in one call
_EVENT = {api: re.compile(rb'"' + key + rb'"\s*:\s*"[^"]')
          for api, key in (("openai", b"text"), ("openai-chat", b"content"), ("triton", b"text_output"))}


def scan_sse(api: str, block: bytes) -> tuple[int, int | None]:
    """Token events and the server's usage count (None if absent) in a block of complete SSE lines. Servers hold
    back tokens that end mid-character, so the usage chunk has the true total."""
    event = _EVENT.get(api, _EVENT["triton"])
    if b'"error"' not in block and b'"completion_tokens"' not in block:
        return len(event.findall(block)), None
    events, usage = 0, None
    for line in block.split(b"\n"):
        line = line.strip()
        if not line.startswith(b"data:"):
            continue
        payload = line[5:].strip()
        if payload == b"[DONE]":
            continue
        total = usage_tokens(payload)
        if total is not None:
            usage = total
        elif b'"error"' in payload:
            events += event_tokens(api, json.loads(payload))  # raises with the server's message
        else:
            events += len(event.findall(payload))
    return events, usage


_FIELDS = (b"data:", b"event:", b"id:", b"retry:", b":")


def scan_stream(api: str, block: bytes) -> tuple[int, int | None, bool]:
    """scan_sse with the stream checked: (token events, usage, whether `data: [DONE]` came). Raises MalformedEvent
    for a line that is no SSE field or a data payload that is neither [DONE] nor a JSON object (checked by its
    braces, not parsed: the hot path stays cheap), ValueError for an error event."""
    done = False
    for line in block.split(b"\n"):
        line = line.strip()
        if not line:
            continue
        if line.startswith(b"data:"):
            payload = line[5:].strip()
            if payload == b"[DONE]":
                done = True
            elif not (payload.startswith(b"{") and payload.endswith(b"}")):
                raise MalformedEvent(f"not a JSON object: {payload[:80]!r}")
        elif not line.startswith(_FIELDS):
            raise MalformedEvent(f"not an SSE field: {line[:80]!r}")
    n, usage = scan_sse(api, block)
    return n, usage, done


_USAGE = re.compile(rb'"completion_tokens"\s*:\s*(\d+)')


def usage_tokens(payload: bytes) -> int | None:
    """completion_tokens of an OpenAI usage object (the last chunk with stream_options.include_usage, or the
    end of a whole JSON body); None if absent."""
    found = _USAGE.findall(payload)
    return int(found[-1]) if found else None


def event_tokens(api: str, event: dict[str, Any]) -> int:
    if "error" in event:
        raise ValueError(str(event["error"])[:200])
    if api == "openai":
        return sum(1 for c in event.get("choices", []) if c.get("text"))
    if api == "openai-chat":
        return sum(1 for c in event.get("choices", []) if (c.get("delta") or {}).get("content"))
    return 1 if event.get("text_output") else 0


async def send(session: aiohttp.ClientSession, api: str, method: str, url: str, body: Any, stream: bool,
               timeout: float, group_by: str | None = None, stall_timeout: float | None = None,
               headers: dict[str, str] | None = None) -> Outcome:
    """One request; stall_timeout: a stream with no token for this long after the response head or the previous
    token is given up as stream_stalled; `headers` are added (a traceparent)."""
    out = Outcome()
    streamed = stream and api != "http"
    try:
        async with asyncio.timeout(timeout):
            async with session.request(method, url, json=body, headers=headers) as resp:
                out.status = resp.status
                if group_by is not None:
                    out.group = resp.headers.get(group_by)
                if resp.status >= 400:
                    await resp.read()
                    out.error = status_error(resp.status, "Retry-After" in resp.headers)
                    return out
                if streamed:
                    done = await _stream(resp, api, out, stall_timeout)
                    if out.error:
                        return out
                    if not done and needs_done(api):
                        out.error = "stream_truncated"
                        return out
                    if out.usage_tokens is not None:
                        out.tokens = out.usage_tokens
                else:
                    payload = await resp.read()
                    out.token_times.append(time.monotonic())
                    if api != "http" and error_body(payload[:256]):
                        out.error = "stream_error"
                    elif api in ("openai", "openai-chat"):
                        out.tokens = int((json.loads(payload).get("usage") or {}).get("completion_tokens", 1))
                    else:
                        out.tokens = 1
    except TimeoutError:
        out.error = "timeout"
    except aiohttp.ClientConnectorError:
        out.error = "connect"
    except MalformedEvent:
        out.error = "stream_malformed"
    except (ValueError, KeyError):
        out.error = "stream_error"
    except aiohttp.ClientPayloadError:
        out.error = "stream_truncated" if streamed else "other"
    except (aiohttp.ClientError, OSError):
        out.error = "other"
    return out


async def _stream(resp: aiohttp.ClientResponse, api: str, out: Outcome, stall_timeout: float | None) -> bool:
    """Read an SSE body into `out`; whether [DONE] came. Sets out.error = stream_stalled on a stall."""
    buf, done, head_at = b"", False, time.monotonic()
    chunks = resp.content.iter_any().__aiter__()
    while True:
        try:
            if stall_timeout is None:
                chunk = await chunks.__anext__()
            else:
                async with asyncio.timeout(None) as gap:  # from the last token (or the head), not the last read
                    last = out.token_times[-1] if out.token_times else head_at
                    gap.reschedule(asyncio.get_running_loop().time() - time.monotonic() + last + stall_timeout)
                    chunk = await chunks.__anext__()
        except StopAsyncIteration:
            return done
        except TimeoutError:
            if stall_timeout is not None and gap.expired():
                out.error = "stream_stalled"
                return done
            raise
        buf += chunk
        cut = buf.rfind(b"\n") + 1
        if not cut:
            continue
        n, usage, end = scan_stream(api, buf[:cut])
        buf = buf[cut:]
        done = done or end
        if usage is not None:
            out.usage_tokens = usage
        if n:
            out.token_times.extend([time.monotonic()] * n)
            out.tokens += n
