"""network.proxy: a chaoskit-run L4 proxy in front of an upstream, with Toxiproxy-style toxics (no root needed)."""

from __future__ import annotations

import json
import os
import shutil
import socket
import time
import uuid
from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal, Protocol, TypeVar
from urllib.parse import urlsplit

from pydantic import Field, field_validator, model_validator

from chaoskit.errors import PreflightError
from chaoskit.injectors import helper_proc
from chaoskit.injectors.base import NETNS_HELPER, NODE_EXECUTORS, NodeHelper
from chaoskit.injectors.proxy import intercept as proxy_intercept
from chaoskit.injectors.proxy.intercept import TABLE_PATTERN, Intercept
from chaoskit.injectors.proxy.server import ORIGINAL, split_addr
from chaoskit.injectors.proxy.server import Toxic as WireToxic
from chaoskit.injectors.proxy.tls import ListenConfig, TlsConfig, UpstreamConfig
from chaoskit.model.types import Duration, Percent, StrictModel
from chaoskit.targets import nftables
from chaoskit.targets.local import NetnsTarget
from chaoskit.targets.netns import resolve_namespace
from chaoskit.targets.process import ProcessRef
from chaoskit.units import parse_rate


class _Toxic(StrictModel):
    stream: Literal["upstream", "downstream"] = Field("downstream", description="downstream = upstream->client")
    toxicity: Percent = Field(1.0, description="chance that a connection gets this toxic")

    def wire(self) -> WireToxic:
        return WireToxic(**self.model_dump())


class LatencyToxic(_Toxic):
    type: Literal["latency"]
    latency: Duration = Field(description="added to every chunk")
    jitter: Duration = 0.0


class BandwidthToxic(_Toxic):
    type: Literal["bandwidth"]
    rate: str | int = Field(description="e.g. '100KiB/s' or '1mbit'")

    @field_validator("rate")
    @classmethod
    def _rate(cls, v: str | int) -> str | int:
        parse_rate(v)
        return v

    def wire(self) -> WireToxic:
        return WireToxic(**{**self.model_dump(), "rate": parse_rate(self.rate)})


class SlowCloseToxic(_Toxic):
    type: Literal["slow_close"]
    delay: Duration = Field(description="hold the close this long")


class TimeoutToxic(_Toxic):
    type: Literal["timeout"]
    timeout: Duration = Field(0.0, description="stop all data; close after this long (0 = never close)")


class ResetPeerToxic(_Toxic):
    type: Literal["reset_peer"]
    timeout: Duration = Field(0.0, description="send a TCP RST after this long")


class SlicerToxic(_Toxic):
    type: Literal["slicer"]
    average_size: int = Field(gt=0, description="bytes per slice")
    size_variation: int = Field(0, ge=0)
    delay: Duration = Field(0.0, description="pause between slices")


class LimitDataToxic(_Toxic):
    type: Literal["limit_data"]
    bytes: int = Field(gt=0, description="close the connection after this many bytes")


Toxic = Annotated[LatencyToxic | BandwidthToxic | SlowCloseToxic | TimeoutToxic | ResetPeerToxic | SlicerToxic
                  | LimitDataToxic, Field(discriminator="type")]


def check_host_port(v: str, zero: bool = False) -> str:
    """A listen or upstream address: host:port with a port in range (a URL is turned into one before this;
    `zero`: port 0 too, an intercepting proxy's free port)."""
    try:
        host, port = split_addr(v)
    except ValueError:
        raise ValueError(f"expected host:port (got {v!r})") from None
    if "/" in host:
        raise ValueError(f"expected host:port, not a URL (got {v!r})")
    if not (0 if zero else 1) <= port < 65536:
        raise ValueError(f"port {port} is out of range")
    return v


class UpstreamTls(StrictModel):
    ca_file: str | None = Field(None, min_length=1, description="PEM file of the CA certificate(s) the upstream's "
                                "certificate must chain to (default: the system's trusted CAs)")
    insecure: bool = Field(False, description="true: do not verify the upstream's certificate or its name (anyone "
                           "on the path could pose as the upstream; the plan says so)")
    server_name: str | None = Field(None, min_length=1, description="the name the upstream's certificate is "
                                    "checked against and sent as SNI (default: the upstream URL's host)")


class ListenTls(StrictModel):
    cert_file: str = Field(min_length=1, description="PEM certificate (chain) the proxy presents to its clients")
    key_file: str = Field(min_length=1, description="PEM private key of cert_file")


def https_upstream(data: Any) -> Any:
    """Before validation: an https:// upstream turns upstream_tls on (by default verified against the system's
    CAs, with the URL's host as the name); upstream_tls beside any other upstream is an error."""
    if not isinstance(data, dict):
        return data
    up = data.get("upstream")
    if isinstance(up, str) and up.lower().startswith("https://"):
        tls = dict(data.get("upstream_tls") or {})
        if not tls.get("server_name"):
            tls["server_name"] = urlsplit(up).hostname
        return {**data, "upstream_tls": tls}
    if data.get("upstream_tls") is not None:
        raise ValueError(f"upstream_tls goes with an https:// upstream (got {up!r})")
    return data


def intercept_listen(data: Any) -> Any:
    """Before validation: with intercept the proxy listens on every address of the namespace, IPv4 and IPv6
    (`[::]:PORT`, or a free port chosen at apply when listen is left out)."""
    if not isinstance(data, dict) or not data.get("intercept"):
        return data
    listen = data.get("listen") or ":0"
    if isinstance(listen, str) and listen.rpartition(":")[0] not in ("", "0.0.0.0", "[::]"):
        raise ValueError(f"with intercept the proxy listens on every address of the namespace ([::], IPv4 and "
                         f"IPv6): give listen as :PORT or leave it out (got {listen!r})")
    return {**data, "listen": f"[::]:{listen.rpartition(':')[2]}" if isinstance(listen, str) else listen}


def check_named_faults(spec: Any) -> None:
    """An L7 proxy spec (llm.proxy, mcp.proxy): check_intercept, listen not its own upstream, fault names unique
    (a fault without one is TYPE-INDEX)."""
    check_intercept(spec)
    if spec.upstream and split_addr(spec.listen) == split_addr(spec.upstream):
        raise ValueError(f"listen and upstream are the same address ({spec.listen}): the proxy would call itself")
    seen: set[str] = set()
    for i, f in enumerate(spec.faults):
        name = f.name or f"{f.type}-{i}"
        if name in seen:
            raise ValueError(f"faults[{i}]: name '{name}' is used twice")
        seen.add(name)


def check_intercept(spec: Any) -> None:
    """After validation: with intercept no upstream (each connection goes where it was meant to) and not the
    intercepted port as its own; without it, listen and upstream are both required."""
    if spec.intercept is None:
        missing = [f for f in ("listen", "upstream") if not getattr(spec, f)]
        if missing:
            raise ValueError(f"{' and '.join(missing)} required (or intercept: {{port, target}})")
        for f in ("listen", "upstream"):
            if split_addr(getattr(spec, f))[1] == 0:
                raise ValueError(f"{f}: port 0 is out of range")
        return
    if spec.upstream:
        raise ValueError("intercept forwards each connection to its original destination: drop upstream")
    if spec.intercept.target.kubernetes is not None and spec.listen_tls is not None:
        raise ValueError("listen_tls names files on this host, and with intercept.target.kubernetes the proxy runs "
                         "on the pod's node: drop listen_tls (the pod's own TLS passes through as bytes)")
    if split_addr(spec.listen)[1] == spec.intercept.port:
        raise ValueError(f"listen port {spec.intercept.port} is the intercepted port itself")


class ProxySpec(StrictModel):
    type: Literal["network.proxy"]
    listen: str = Field("", description="host:port clients connect to (127.0.0.1 by default when only ':port'); "
                        "required unless intercept (then :PORT in the namespace, default a free port)")
    upstream: str | None = Field(None, description="host:port of the real service (a URL such as http://host:8000/v1 gives "
                                      "its host:port: the proxy works below HTTP; a client's own TLS passes "
                                      "through as bytes). https://host:port: the proxy itself speaks TLS to it "
                                      "(see upstream_tls)")
    toxics: list[Toxic] = Field(default_factory=list, description="applied in order (to the decrypted bytes "
                                "where the proxy ends or starts TLS)")
    upstream_tls: UpstreamTls | None = Field(None, description="with an https:// upstream (set by it, checked by "
                                             "default): how the upstream's certificate is checked")
    listen_tls: ListenTls | None = Field(None, description="end TLS from the clients with this certificate and key "
                                         "(clients connect with TLS; the proxy decrypts and relays)")
    intercept: Intercept | None = Field(None, description="transparent: the proxy runs in target's namespace and "
                                        "an nftables redirect sends port's new incoming connections to it, each "
                                        "forwarded to its original destination (no upstream; clients unchanged; "
                                        "root)")

    @model_validator(mode="before")
    @classmethod
    def _https(cls, data: Any) -> Any:
        return intercept_listen(https_upstream(data))

    @model_validator(mode="after")
    def _intercept(self) -> ProxySpec:
        check_intercept(self)
        return self

    @field_validator("upstream", mode="before")
    @classmethod
    def _url(cls, v: object) -> object:
        if isinstance(v, str) and "://" in v:
            url = urlsplit(v)
            if url.scheme not in ("http", "https") or not url.hostname:
                raise ValueError(f"expected host:port or an http(s) URL (got {v!r})")
            host = f"[{url.hostname}]" if ":" in url.hostname else url.hostname
            return f"{host}:{url.port or (443 if url.scheme == 'https' else 80)}"
        return v

    @field_validator("listen", "upstream")
    @classmethod
    def _addr(cls, v: str | None) -> str | None:
        return check_host_port(v, zero=True) if v else v


class ProxyRecord(helper_proc.HelperRecord):
    """A proxy's record: the token its helper carries and where it listens; once started, the helper itself."""

    listen: str
    upstream: str
    proxy: ProcessRef | None = None
    listen_tls: bool = False  # clients speak TLS to it (its own /chaoskit/ endpoints too)
    ns: str | None = None  # intercept: the namespace the proxy and the redirect are in (its inode, the table)
    ns_inode: int | None = None
    table: str | None = Field(None, pattern=TABLE_PATTERN)
    reset_connections: int | None = None  # intercept with existing: reset: how many open connections were reset


ProxyRecordT = TypeVar("ProxyRecordT", bound=ProxyRecord)


class HelperStats(Protocol):
    """A proxy helper's counters as its /chaoskit/stats answers them."""

    @classmethod
    def read(cls, data: Any) -> HelperStats | None: ...  # None: not an answer of ours

    def to_json(self) -> Any: ...


class ProxyHelper(helper_proc.HelperFault[Any, ProxyRecordT]):
    """A proxy run as a helper process (its `helper` module) listening on spec.listen and relaying to
    spec.upstream; subclasses give its JSON configuration."""
    independent_revert: ClassVar[bool] = True
    Record: ClassVar[type[ProxyRecord]] = ProxyRecord

    helper: ClassVar[str | None] = "chaoskit.injectors.proxy.helper"  # listens, says ready, then runs `server`
    forked: ClassVar[bool] = True  # in a run: from its forkserver (proxy_fork), the same helper
    # intercept.target.kubernetes: in a helper pod on each chosen pod's node, which runs the proxy in the pod's
    # network namespace (joined through its container init's /proc/PID/ns/net) and puts the redirect there
    executors: ClassVar[frozenset[str]] = NODE_EXECUTORS
    target_field: ClassVar[str | None] = "intercept.target.kubernetes"
    node_helper: ClassVar[NodeHelper] = NETNS_HELPER
    server: ClassVar[str]  # the server module proxy_proc runs
    what: ClassVar[str]
    token_prefix: ClassVar[str]
    stats_type: ClassVar[type[HelperStats] | None] = None  # its counters, where its server keeps some

    def config(self) -> Any:
        """What the helper server is started with (JSON)."""
        raise NotImplementedError

    def resolve_target(self) -> NetnsTarget | None:
        ic = self.spec.intercept
        return None if ic is None else resolve_namespace(ic.target, False, f"{self.type} intercept")

    def preflight(self) -> None:
        if self.spec.intercept is not None:
            self._preflight_intercept()
        else:
            self._preflight_listen()
        if self.tls_wire() is not None:
            self._preflight_tls()

    def _preflight_intercept(self) -> None:
        if os.geteuid() != 0:
            raise PreflightError(f"{self.type}: intercept needs root (CAP_NET_ADMIN, to join the namespace)")
        t = self.target_as(NetnsTarget)
        try:
            nftables.tables(t.ns_path)
        except (nftables.NftError, OSError) as e:
            raise PreflightError(f"{self.type}: nftables unusable in {t.label}: {e}") from None
        if self.spec.intercept.existing == "reset" and shutil.which("ss") is None:
            raise PreflightError(f"{self.type}: intercept existing: reset needs `ss` (iproute2)")

    def _preflight_listen(self) -> None:
        host, port = split_addr(self.spec.listen)
        with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                s.bind((host, port))
            except OSError as e:
                raise PreflightError(f"{self.type}: cannot listen on {self.spec.listen}: {e.strerror}") from None

    def _preflight_tls(self) -> None:
        """The TLS files load, and an upstream that answers now accepts the handshake (its certificate trusted)."""
        from chaoskit.injectors.proxy import tls as proxy_tls

        tls = self.tls_wire() or TlsConfig()
        try:
            proxy_tls.Tls.of(tls)
        except (OSError, ValueError) as e:  # ssl.SSLError is an OSError
            which = "listen_tls" if tls.listen is not None and not isinstance(e, FileNotFoundError) else "a TLS file"
            raise PreflightError(f"{self.type}: {which} cannot be loaded: {proxy_tls.why(e)}"
                                 + (f" ({e.filename})" if getattr(e, "filename", None) else "")) from None
        if tls.upstream is not None:
            why = proxy_tls.check_upstream(*split_addr(self.spec.upstream), tls.upstream)
            if why is not None:
                ca = tls.upstream.ca_file or "the system's CAs"
                raise PreflightError(f"{self.type}: upstream {self.spec.upstream}: {why} (checked against {ca}; "
                                     "upstream_tls.ca_file names the CA to trust, insecure: true skips the check)")

    def tls_wire(self) -> TlsConfig | None:
        """The helper's `tls` configuration (absolute paths), None when the proxy speaks plain TCP both ways."""
        up, down = self.spec.upstream_tls, self.spec.listen_tls
        if up is None and down is None:
            return None
        return TlsConfig(
            listen=ListenConfig(str(Path(down.cert_file).resolve()), str(Path(down.key_file).resolve()))
            if down is not None else None,
            upstream=UpstreamConfig(str(Path(up.ca_file).resolve()) if up.ca_file else None, up.insecure,
                                    up.server_name) if up is not None else None)

    def tls_plan(self) -> str:
        """The plan's words on TLS ('' when there is none)."""
        up, down = self.spec.upstream_tls, self.spec.listen_tls
        parts = []
        if down is not None:
            parts.append(f"clients connect with TLS (certificate {down.cert_file})")
        if up is not None:
            if up.insecure:
                parts.append("TLS to the upstream WITHOUT VERIFYING its certificate (insecure: true: anyone on the "
                             "path could pose as the upstream)")
            else:
                parts.append(f"TLS to the upstream, its certificate verified against "
                             f"{up.ca_file or 'the system CAs'} as {up.server_name}")
        return f" [{'; '.join(parts)}]" if parts else ""

    def effects(self) -> str:
        """What the proxy does to the traffic, in the plan's words (`with toxics: ...`)."""
        raise NotImplementedError

    def node_plan(self, pods: str) -> str:
        """What a helper pod does on its node for intercept.target.kubernetes (the k8s-helper executor's plan
        line, after `on node N: a helper pod (...)`); `pods`: the node's chosen pods, in words."""
        ic = self.spec.intercept
        existing = "reset" if ic.existing == "reset" else "not touched"
        return (f"intercepts port {ic.port} in the network namespace of {pods}: {self.type}, a {self.what} "
                f"{self.effects()}, runs in that namespace (joined through /proc/PID/ns/net of the container's "
                f"init), and nft table {proxy_intercept.FAMILY} chaoskit_<id> there redirects new incoming TCP "
                f"connections to port {ic.port} (IPv4 and IPv6) to it, which forwards each to its original destination "
                f"(connections already open: {existing}); its revert deletes the table first, then stops the proxy")

    def intercept_plan(self) -> tuple[str, str]:
        """The plan's words on interception: where the proxy sits, and its revert ('' and '' without it)."""
        ic = self.spec.intercept
        if ic is None:
            return "", ""
        existing = ("then reset (their clients reconnect through the proxy)" if ic.existing == "reset"
                    else "not touched")
        return (f" in {ic.target.label()}, intercepting port {ic.port} (nft table {proxy_intercept.FAMILY} "
                f"chaoskit_<id> there redirects new incoming TCP connections to port {ic.port} (IPv4 and IPv6) to the "
                f"proxy, which forwards each to its original destination; connections already open are "
                f"{existing})",
                "revert: delete the table first (new connections go straight to the service again), then stop "
                "the proxy (the connections it carries are closed; it also exits by itself after "
                f"{self.ctx.lifetime_s:g}s, deleting the table first)")

    def prepare(self) -> ProxyRecordT:
        rec = self.Record(token=f"{self.token_prefix}{uuid.uuid4().hex}", listen=self.spec.listen,
                          upstream=self.spec.upstream or ORIGINAL, listen_tls=self.spec.listen_tls is not None)
        if self.spec.intercept is not None:
            t = self.target_as(NetnsTarget)
            port = split_addr(self.spec.listen)[1] or proxy_intercept.free_port(t.ns_path)
            rec = rec.model_copy(update={"listen": f"[::]:{port}", "ns": t.ns_path, "ns_inode": t.ns_inode,
                                         "table": f"chaoskit_{uuid.uuid4().hex[:12]}"})
        return rec  # type: ignore[return-value]  # self.Record is the family's ProxyRecordT

    @classmethod
    def revert(cls, record: ProxyRecordT) -> None:
        cls.revert_many([record])

    @classmethod
    def revert_many(cls, records: list[ProxyRecordT]) -> None:
        """Stop the helpers of many proxies together: they exit side by side, one wait for all (revert is this for
        one; the rollback still reverts and observes each after this). An intercepting proxy's redirect is
        deleted first, so no new connection is sent to a proxy that is going away (the helpers are stopped even
        where deleting one failed; that failure is raised after)."""
        failed: list[Exception] = []
        for r in records:
            if r.table and r.ns and r.ns_inode is not None:
                try:
                    proxy_intercept.remove(r.ns, r.ns_inode, r.table)
                except Exception as e:
                    failed.append(e)
        helper_proc.stop_all([p for r in records for p in cls._helpers(r)])
        if failed:
            raise failed[0]

    @classmethod
    def observe(cls, record: ProxyRecordT) -> bool:
        """Anything of it left: the helper, or an intercepting proxy's redirect."""
        ns, inode, table = record.ns, record.ns_inode, record.table
        if table and ns and inode is not None and proxy_intercept.present(ns, inode, table):
            return True
        return bool(cls._helpers(record))

    @staticmethod
    def _helpers(r: ProxyRecord) -> list[ProcessRef]:
        return helper_proc.marked(r.token, r.proxy)

    @classmethod
    def observe_details(cls, record: ProxyRecordT) -> dict[str, Any]:
        """In effect or not, and while it runs the helper's own counters (its /chaoskit/stats answer read as
        `stats_type`, asked in its namespace where it intercepts) where its family keeps some."""
        running = cls.observe(record)
        stats = cls.stats_type.read(cls._stats_json(record)) if running and cls.stats_type is not None else None
        return {"in_effect": running, **(stats.to_json() if stats is not None else {})}

    @staticmethod
    def _stats_json(record: ProxyRecord) -> Any:
        if record.ns:
            from chaoskit.targets.netns import run_in_netns

            return run_in_netns(record.ns, lambda: stats_json(record.listen, tls=record.listen_tls))
        return stats_json(record.listen, tls=record.listen_tls)

    def apply(self, record: ProxyRecordT) -> ProxyRecordT:
        """Start the helper (in the namespace, for intercept), then, for intercept, the redirect to it."""
        ns, table = record.ns, record.table  # intercept: prepare set both
        args = [self.server, record.listen, record.upstream, json.dumps(self.config()),
                f"{time.time() + self.ctx.lifetime_s:.3f}"]
        what = f"{self.what} on {record.listen}" + (f" in {ns}" if ns else "")
        env = {"CHAOSKIT_PROXY_NETNS": ns, "CHAOSKIT_PROXY_TABLE": table} if ns and table else None
        if (fs := self.ctx.forkserver) is not None:  # in a run: forked, ~2 ms of CPU instead of ~45
            ref = fs.spawn(record.token, args, what, env)
        else:
            ref = helper_proc.spawn(self.helper, record.token, args, what, env)
        out = record.model_copy(update={"proxy": ref})
        ic = self.spec.intercept
        if ns and table and ic is not None:
            try:
                proxy_intercept.add(ns, table, ic.port, split_addr(record.listen)[1])
                if ic.existing == "reset":  # after the redirect: their clients reconnect through the proxy
                    out = out.model_copy(update={"reset_connections": proxy_intercept.reset_open(ns, ic.port)})
            except Exception:  # nothing of it left behind: the redirect (if in) and the proxy
                type(self).revert_many([out])
                raise
        return out


class Proxy(ProxyHelper[ProxyRecord]):
    type: ClassVar[str] = "network.proxy"
    server: ClassVar[str] = "chaoskit.injectors.proxy.server"
    what: ClassVar[str] = "proxy"
    token_prefix: ClassVar[str] = "chaoskit-proxy-"
    summary: ClassVar[str] = "L4 proxy with toxics: latency, bandwidth, slow_close, timeout, reset_peer, slicer, limit_data"
    Spec = ProxySpec
    spec: ProxySpec


    def effects(self) -> str:
        toxics = "; ".join(f"{t.type} ({t.stream}, {t.toxicity * 100:g}% of connections)" for t in self.spec.toxics)
        return f"with toxics: {toxics or 'none'}"

    def plan(self) -> list[str]:
        tls = self.tls_plan()
        if tls:
            tls += (" (the proxy decrypts and re-encrypts: the toxics act on the plaintext bytes, and each side "
                    "sees its own TLS records, not the other side's)")
        where, revert = self.intercept_plan()
        return [f"start a proxy{where or f' {self.spec.listen} -> {self.spec.upstream}'}{tls} {self.effects()}; "
                + (revert or f"revert: stop it (it also exits by itself after {self.ctx.lifetime_s:g}s)")]

    def config(self) -> Any:
        toxics = [t.wire().to_json() for t in self.spec.toxics]
        tls = self.tls_wire()
        return toxics if tls is None else {"toxics": toxics, "tls": tls.to_json()}


def stats_json(listen: str, timeout: float = 2.0, tls: bool = False) -> Any:
    """A proxy helper's own counters (GET /chaoskit/stats, JSON; over HTTPS where it ends TLS: our own helper on
    the address we gave it, so its certificate is not checked); None when it does not answer."""
    import urllib.request

    host, port = split_addr(listen)
    host = "127.0.0.1" if host in ("::", "0.0.0.0") else f"[{host}]" if ":" in host else host  # (listening on all)
    ctx = None
    if tls:
        import ssl

        ctx = ssl._create_unverified_context()
    try:
        with urllib.request.urlopen(f"{'https' if tls else 'http'}://{host}:{port}/chaoskit/stats", timeout=timeout,
                                    context=ctx) as r:
            return json.loads(r.read())
    except (OSError, ValueError):  # not an answer of ours
        return None
