"""TLS for the proxy helpers and their preflight: ssl contexts from a proxy's `tls` configuration (stdlib only)."""

from __future__ import annotations

import socket
import ssl
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Tls:
    """The contexts of one proxy: toward its clients (None: plain TCP) and toward its upstream (None: plain)."""

    listen: ssl.SSLContext | None
    upstream: ssl.SSLContext | None
    server_name: str | None  # checked against the upstream's certificate and sent as SNI

    @classmethod
    def of(cls, cfg: dict[str, Any] | None, alpn: list[str] | None = None) -> Tls:
        """From the wire form {"listen": {cert_file, key_file}, "upstream": {ca_file, insecure, server_name}}
        (either part absent: plain on that side); ssl.SSLError / OSError when a file cannot be loaded."""
        cfg = cfg or {}
        up, down = cfg.get("upstream"), cfg.get("listen")
        return cls(server_context(down, alpn) if down else None, client_context(up, alpn) if up else None,
                   up.get("server_name") if up else None)


def client_context(cfg: dict[str, Any], alpn: list[str] | None = None) -> ssl.SSLContext:
    """Toward the upstream: verified against ca_file (else the system's CAs), unless insecure."""
    ctx = ssl.create_default_context(cafile=cfg.get("ca_file"))
    if cfg.get("insecure"):
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
    if alpn:
        ctx.set_alpn_protocols(alpn)
    return ctx


def server_context(cfg: dict[str, Any], alpn: list[str] | None = None) -> ssl.SSLContext:
    """Toward the clients: the given certificate chain and key."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(cfg["cert_file"], cfg["key_file"])
    if alpn:
        ctx.set_alpn_protocols(alpn)
    return ctx


def why(e: BaseException) -> str:
    """A TLS failure in words (the verification's own reason when it is one)."""
    if isinstance(e, ssl.SSLCertVerificationError):
        return f"TLS: the upstream's certificate is not trusted: {e.verify_message or e.reason}"
    if isinstance(e, ssl.SSLError):
        return f"TLS: {e.reason or e}"
    return str(e.strerror if isinstance(e, OSError) and e.strerror else e)


def check_upstream(host: str, port: int, cfg: dict[str, Any], timeout: float = 2.0) -> str | None:
    """Preflight: a TLS handshake with the upstream now. The refusal of its certificate (or of the handshake) in
    words; None when it succeeds or the upstream cannot be reached at all (the proxy reports that per
    connection: it may come up later)."""
    ctx = client_context(cfg)
    try:
        with socket.create_connection((host, port), timeout=timeout) as raw:
            with ctx.wrap_socket(raw, server_hostname=cfg.get("server_name")):
                return None
    except ssl.SSLError as e:
        return why(e)
    except (OSError, ValueError):
        return None


def quiet_handshakes(loop: Any) -> None:
    """A client's failed TLS handshake is its own business: not logged (the helper's stderr is read by nobody)."""
    default = loop.get_exception_handler()

    def handler(lp: Any, context: dict[str, Any]) -> None:
        if isinstance(context.get("exception"), (ssl.SSLError, ConnectionError)):
            return
        if default is not None:
            default(lp, context)
        else:
            lp.default_exception_handler(context)

    loop.set_exception_handler(handler)
