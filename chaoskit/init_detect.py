"""What answers at a URL, for `chaoskit init`: OpenAI-compatible, Triton (KServe v2), plain HTTP, or nothing."""

from __future__ import annotations

import json
import socket
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from typing import Any

TIMEOUT_S = 2.0
MAX_BODY = 1 << 20
HEALTH_PATHS = ("/health", "/healthz", "/readyz", "/ready", "/")  # plain HTTP: the first that answers 2xx


@dataclass
class Detected:
    """The kind of server found (None: nothing answered), its first model, its health path, and notes on
    what could not be found out."""

    kind: str | None = None  # openai | triton | http | None
    model: str | None = None
    health_path: str = "/"
    health_status: int = 200  # the status the health probe expects (0: any status below 500)
    evidence: str = ""  # one line: what answered, for the file's header
    notes: list[str] = field(default_factory=list)


@dataclass
class Answer:
    status: int  # 0: no HTTP answer
    body: bytes = b""
    error: str = ""  # why there was no answer


_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # no $http_proxy: servers are local


def request(url: str, body: Any = None) -> Answer:
    """One GET (or POST of a JSON body) with a short timeout; an HTTP error status is an answer too."""
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method="GET" if body is None else "POST",
                                 headers={"Content-Type": "application/json"} if data else {})
    try:
        with _OPENER.open(req, timeout=TIMEOUT_S) as resp:
            return Answer(resp.status, resp.read(MAX_BODY))
    except urllib.error.HTTPError as e:
        return Answer(e.code, e.read(MAX_BODY) if e.fp else b"")
    except urllib.error.URLError as e:
        return Answer(0, error=_reason(e.reason))
    except TimeoutError:
        return Answer(0, error=f"no answer within {TIMEOUT_S:g} s")
    except (OSError, ValueError) as e:  # a reset, a malformed status line ...
        return Answer(0, error=f"{type(e).__name__}: {e}")


def _reason(reason: object) -> str:
    if isinstance(reason, ConnectionRefusedError):
        return "connection refused (nothing listens there)"
    if isinstance(reason, TimeoutError):
        return f"no answer within {TIMEOUT_S:g} s"
    if isinstance(reason, socket.gaierror):
        return f"host not found ({reason.strerror})"
    return str(reason)


def _json(body: bytes) -> Any:
    try:
        return json.loads(body)
    except ValueError:
        return None


def openai_models(doc: Any) -> list[str]:
    """The model ids of a /v1/models answer ({"data": [{"id": ...}, ...]})."""
    data = doc.get("data") if isinstance(doc, dict) else None
    return [m["id"] for m in data or [] if isinstance(m, dict) and isinstance(m.get("id"), str) and m["id"]]


def triton_models(doc: Any) -> list[str]:
    """The model names of a POST /v2/repository/index answer, READY ones first."""
    rows = [m for m in doc if isinstance(m, dict) and isinstance(m.get("name"), str)] if isinstance(doc, list) else []
    ready = [m["name"] for m in rows if m.get("state", "READY") == "READY"]
    return ready + [m["name"] for m in rows if m["name"] not in ready]


def detect(base: str) -> Detected:
    """Ask `base` (http://host:port) what it is: /v1/models, then /v2/health/ready, then any HTTP answer."""
    first = request(f"{base}/v1/models")
    if first.status == 0:
        return Detected(notes=[f"{base}: {first.error}: could not detect the kind of server, its model or its "
                               "health endpoint"])
    if first.status == 200 and isinstance(_json(first.body), dict):
        return _openai(base, _json(first.body))
    ready = request(f"{base}/v2/health/ready")
    if ready.status == 200:
        return _triton(base)
    return _plain(base, [f"GET /v1/models answered {first.status}", f"GET /v2/health/ready answered "
                         f"{ready.status or ready.error}"])


def _openai(base: str, doc: Any) -> Detected:
    models = openai_models(doc)
    found = Detected("openai", models[0] if models else None, "/v1/models",
                     evidence="GET /v1/models answered 200" + (f" with {len(models)} model(s)" if models else ""))
    if not models:
        found.notes.append(f"{base}/v1/models listed no model: set vars.model to a model the server serves")
    return found


def _triton(base: str) -> Detected:
    index = request(f"{base}/v2/repository/index", {})
    models = triton_models(_json(index.body)) if index.status == 200 else []
    found = Detected("triton", models[0] if models else None, f"/v2/models/{models[0]}/ready" if models
                     else "/v2/health/ready", evidence="GET /v2/health/ready answered 200"
                     + (f"; POST /v2/repository/index listed {len(models)} model(s)" if models else ""))
    if not models:
        why = f"answered {index.status}" if index.status else index.error
        found.notes.append(f"{base}/v2/repository/index {why} and listed no model: set vars.model to a model "
                           "with a generate-style text_input/max_tokens interface")
    return found


def _plain(base: str, seen: list[str]) -> Detected:
    statuses = []
    for path in HEALTH_PATHS:
        answer = request(f"{base}{path}")
        statuses.append(f"{path} {answer.status or answer.error}")
        if 200 <= answer.status < 300:
            return Detected("http", None, path, 200, evidence=f"GET {path} answered {answer.status} ("
                            f"{'; '.join(seen)})")
    return Detected("http", None, "/", 0, evidence=f"an HTTP server ({'; '.join(seen)})",
                    notes=[f"{base}: no health endpoint answered 2xx ({', '.join(statuses)}): the health probe "
                           "accepts any status below 500 on /; point it at your health endpoint"])
