"""The proxy behind kv.notify: relays KV side-channel connections (chaoskit.reference.pd_kv frames) and does its
fault to the done notifications alone; bootstrap, transfer and abort frames pass untouched.

Started by chaoskit.injectors.proxy.helper (`proxy/helper.py TOKEN chaoskit.injectors.kv_notify.server LISTEN
original-destination CONFIG_JSON UNTIL_EPOCH`) in the decode server's namespace, where an nftables redirect sends
it the KV port's connections. CONFIG: `{"drop": share, "delay": seconds, "duplicate": share, "corrupt": share, "stats": path}`; `corrupt` alters
the bytes of that share of transfers (every byte of their pieces inverted), the frames intact, as a faulty link or
memory would: the decode server decodes over wrong K/V unless it checks a checksum. A
dropped notification is lost as a message on a live connection is: the connection to the decode server stays
open after the prefill side closes (a transfer that looks in progress), until the proxy stops. Counts go to the
stats file (JSON) after each notification.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import socket
import struct
from typing import Any, NamedTuple

from chaoskit.injectors.proxy.server import Listener, original_dst, serve_helper, serve_until

HEAD = struct.Struct("!cQI")  # pd_kv's frame head: type, room, length
DONE, TRANSFER = b"D", b"T"
INVERT = bytes(255 - b for b in range(256))  # every byte inverted, at C speed (bytes.translate)


class NotifyConfig(NamedTuple):
    """kv.notify's helper configuration: the chance a notification is dropped, duplicated or corrupted, its delay
    in seconds, and the file its counts are written to (None: none)."""

    drop: float = 0.0
    delay: float = 0.0
    duplicate: float = 0.0
    corrupt: float = 0.0
    stats: str | None = None

    @classmethod
    def from_json(cls, data: Any) -> NotifyConfig:
        """From its argv's JSON (KvNotify.config)."""
        return cls(*(float(data.get(k, 0)) for k in ("drop", "delay", "duplicate", "corrupt")), data.get("stats"))


class Notify:
    """The fault and its counts."""

    def __init__(self, cfg: NotifyConfig):
        self.drop, self.delay, self.duplicate, self.corrupt, self.stats = cfg
        self.counts = {"connections": 0, "notifications": 0, "dropped": 0, "delayed": 0, "duplicated": 0,
                       "corrupted": 0}
        self.held: list[asyncio.StreamWriter] = []  # upstream connections whose notification was dropped

    def save(self) -> None:
        if self.stats:
            tmp = f"{self.stats}.tmp"
            with open(tmp, "w") as f:
                json.dump(self.counts, f)
            os.replace(tmp, self.stats)

    async def relay(self, client: socket.socket) -> None:
        dst = original_dst(client)
        if dst is None:
            client.close()
            return
        try:
            reader, writer = await asyncio.open_connection(sock=client)
            up_reader, up_writer = await asyncio.open_connection(*dst)
        except OSError:
            client.close()
            return
        self.counts["connections"] += 1
        back = asyncio.create_task(_copy(up_reader, writer))
        dropped, corrupt = False, random.random() < self.corrupt
        if corrupt:
            self.counts["corrupted"] += 1
            self.save()
        try:
            while True:
                head = await reader.readexactly(HEAD.size)
                kind, _, n = HEAD.unpack(head)
                frame = head + (await reader.readexactly(n) if n else b"")
                if kind == DONE:
                    dropped = await self._notification(frame, up_writer) or dropped
                elif kind == TRANSFER and corrupt and n:
                    up_writer.write(head + frame[HEAD.size:].translate(INVERT))
                else:
                    up_writer.write(frame)
                await up_writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError, OSError):
            pass
        finally:
            writer.close()
            back.cancel()
            if dropped:
                self.held.append(up_writer)  # lost, not refused: the decode side sees nothing more
            else:
                up_writer.close()

    async def _notification(self, frame: bytes, up: asyncio.StreamWriter) -> bool:
        """Do the fault to one done notification; True when it was dropped."""
        self.counts["notifications"] += 1
        try:
            if random.random() < self.drop:
                self.counts["dropped"] += 1
                return True
            if self.delay > 0:
                self.counts["delayed"] += 1
                await asyncio.sleep(self.delay)
            up.write(frame)
            if random.random() < self.duplicate:
                self.counts["duplicated"] += 1
                up.write(frame)
            return False
        finally:
            self.save()


async def _copy(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    except (ConnectionError, OSError):
        pass


async def serve(sock: socket.socket, upstream: str, config: NotifyConfig, until: float) -> None:
    notify = Notify(config)
    notify.save()
    await serve_until(Listener(sock, notify.relay), until)


def helper_main(sock: socket.socket, argv: list[str]) -> int:
    """Called by proxy_proc with its listening socket."""
    return serve_helper(sock, argv, serve, NotifyConfig.from_json)
