"""One HTTP request of a readiness or status check, its answer summed up (status, and why when not 2xx)."""

from __future__ import annotations

import http.client
import json
import urllib.error
import urllib.request
from dataclasses import dataclass


@dataclass(frozen=True)
class Answer:
    """What one request got: the HTTP status (0: nothing answered) and, unless 2xx, why (the server's error
    message, or why nothing answered)."""

    status: int
    message: str = ""

    @property
    def ok(self) -> bool:
        return 200 <= self.status < 300

    def describe(self) -> str:
        if self.status == 0:
            return f"no answer ({self.message})"
        return f"HTTP {self.status}" + (f": {self.message}" if self.message else "")


def http_answer(url: str, body: dict | None = None, timeout: float = 5.0) -> Answer:
    """A GET (or a JSON POST when `body` is given), read to the end."""
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, method="POST" if data else "GET",
                                 headers={"Content-Type": "application/json"} if data else {})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            r.read()
            return Answer(r.status)
    except urllib.error.HTTPError as e:
        return Answer(e.code, error_message(e.read()))
    except urllib.error.URLError as e:
        return Answer(0, str(e.reason))
    except (OSError, http.client.HTTPException) as e:  # timed out, reset, a torn answer
        return Answer(0, str(e) or type(e).__name__)


def error_message(body: bytes) -> str:
    """The error a server put in its answer: Triton's {"error": "..."}, OpenAI's {"error": {"message": ...}},
    else the start of the body."""
    try:
        doc = json.loads(body)
    except ValueError:
        return body.decode(errors="replace").strip()[:200]
    err = doc.get("error", doc) if isinstance(doc, dict) else doc
    if isinstance(err, dict):
        err = err.get("message", err)
    return str(err)[:200]


def http_status(url: str, body: dict | None = None, timeout: float = 5.0) -> int:
    """HTTP status of a GET (or a JSON POST when `body` is given); 0 when nothing answered."""
    return http_answer(url, body, timeout).status
