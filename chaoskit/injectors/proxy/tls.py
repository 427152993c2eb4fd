"""TLS for the proxy helpers and their preflight: ssl contexts from a proxy's `tls` configuration (stdlib only)."""

from __future__ import annotations

import socket
import ssl
from dataclasses import asdict, dataclass
from typing import Any

TlsJson = dict[str, dict[str, str | bool | None]]  # TlsConfig's wire form: {"listen": {...}, "upstream": {...}}


@dataclass(frozen=True)
class UpstreamConfig:
    """Toward the upstream: the CA file its certificate must chain to (None: the system's CAs), or no check at all
    (insecure); the name its certificate is checked against and sent as SNI."""

    ca_file: str | None = None
    insecure: bool = False
    server_name: str | None = None


@dataclass(frozen=True)
class ListenConfig:
    """Toward the clients: the certificate chain the proxy presents and its key (PEM files)."""

    cert_file: str
    key_file: str


@dataclass(frozen=True)
class TlsConfig:
    """A proxy's `tls` configuration, as the injector gives it to its helper: either side absent is plain TCP."""

    listen: ListenConfig | None = None
    upstream: UpstreamConfig | None = None

    def to_json(self) -> TlsJson:
        out: TlsJson = {}
        if self.upstream is not None:
            out["upstream"] = asdict(self.upstream)
        if self.listen is not None:
            out["listen"] = asdict(self.listen)
        return out

    @classmethod
    def from_json(cls, data: TlsJson) -> TlsConfig:
        up, down = data.get("upstream"), data.get("listen")
        return cls(ListenConfig(**down) if down else None,  # type: ignore[arg-type]  # our own to_json's
                   UpstreamConfig(**up) if up else None)  # type: ignore[arg-type]


@dataclass(frozen=True)
class Tls:
    """The contexts of one proxy: toward its clients (None: plain TCP) and toward its upstream (None: plain)."""

    listen: ssl.SSLContext | None
    upstream: ssl.SSLContext | None
    server_name: str | None  # checked against the upstream's certificate and sent as SNI

    @classmethod
    def of(cls, cfg: TlsConfig, alpn: list[str] | None = None) -> Tls:
        """The contexts of `cfg` (either part absent: plain on that side); ssl.SSLError / OSError when a file
        cannot be loaded."""
        up, down = cfg.upstream, cfg.listen
        return cls(server_context(down, alpn) if down else None, client_context(up, alpn) if up else None,
                   up.server_name if up else None)


def client_context(cfg: UpstreamConfig, alpn: list[str] | None = None) -> ssl.SSLContext:
    """Toward the upstream: verified against ca_file (else the system's CAs), unless insecure."""
    ctx = ssl.create_default_context(cafile=cfg.ca_file)
    if cfg.insecure:
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
    if alpn:
        ctx.set_alpn_protocols(alpn)
    return ctx


def server_context(cfg: ListenConfig, alpn: list[str] | None = None) -> ssl.SSLContext:
    """Toward the clients: the given certificate chain and key."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(cfg.cert_file, cfg.key_file)
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


def check_upstream(host: str, port: int, cfg: UpstreamConfig, timeout: float = 2.0) -> str | None:
    """Preflight: a TLS handshake with the upstream now. The refusal of its certificate (or of the handshake) in
    words; None when it succeeds or the upstream cannot be reached at all (the proxy reports that per
    connection: it may come up later)."""
    ctx = client_context(cfg)
    try:
        with socket.create_connection((host, port), timeout=timeout) as raw:
            with ctx.wrap_socket(raw, server_hostname=cfg.server_name):
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
