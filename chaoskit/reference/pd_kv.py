"""The KV side channel of the disaggregated tiny_lm (chaoskit.reference.pd_server): how a prefill server hands a
request's KV cache to a decode server, modelled on NIXL/Mooncake transfers.

One TCP connection per transfer, prefill -> decode's KV port. Frames: a type byte, the 8-byte room (the
request's transfer id, chosen by the router), a 4-byte length, the payload. `B` bootstrap (payload: JSON with
the prompt's token count and the layers' shapes), `T` transfer (a piece of the K/V bytes), `D` done (the
notification: the KV is whole), `A` abort (the prefill gave the request up). The receiver keeps each room's
state (waiting -> bootstrapped -> transferring -> done | aborted | broken) for the decode request to claim.
"""

from __future__ import annotations

import asyncio
import json
import struct
import time
import zlib
from dataclasses import dataclass, field

import numpy as np

HEAD = struct.Struct("!cQI")
PIECE = 256 * 1024
BOOTSTRAP, TRANSFER, DONE, ABORT = b"B", b"T", b"D", b"A"
ENDED = frozenset({"done", "aborted", "broken", "overdue", "corrupt"})


class TransferFailed(Exception):
    """The room's KV will not come: the prefill aborted it, or (when the decode is told to notice) its
    connection broke before the done notification."""


@dataclass
class Room:
    """One transfer as the decode side sees it."""

    state: str = "waiting"
    meta: dict = field(default_factory=dict)
    data: bytearray = field(default_factory=bytearray)
    result: asyncio.Future | None = None
    created: float = field(default_factory=time.monotonic)


def pack(kind: bytes, room: int, payload: bytes = b"") -> bytes:
    return HEAD.pack(kind, room, len(payload)) + payload


def encode(k_v: list[tuple[np.ndarray, np.ndarray]]) -> tuple[dict, bytes]:
    """The K/V of every layer (each n x dim float32) as one byte string and its shape."""
    n, dim = k_v[0][0].shape
    return {"layers": len(k_v), "tokens": n, "dim": dim}, b"".join(
        np.ascontiguousarray(a, dtype=np.float32).tobytes() for kv in k_v for a in kv)


def decode(meta: dict, data: bytes) -> list[tuple[np.ndarray, np.ndarray]]:
    arr = np.frombuffer(bytes(data), dtype=np.float32).reshape(meta["layers"], 2, meta["tokens"], meta["dim"])
    return [(arr[i, 0], arr[i, 1]) for i in range(meta["layers"])]


async def send(addr: tuple[str, int], room: int, meta: dict, data: bytes, checksum: bool = False) -> None:
    """One transfer: bootstrap, the bytes in pieces, done (with `checksum`, carrying the CRC-32 of the bytes);
    OSError if the decode cannot be reached."""
    _, writer = await asyncio.open_connection(*addr)
    try:
        writer.write(pack(BOOTSTRAP, room, json.dumps(meta).encode()))
        for i in range(0, len(data), PIECE):
            writer.write(pack(TRANSFER, room, data[i:i + PIECE]))
            await writer.drain()
        writer.write(pack(DONE, room, struct.pack("!I", zlib.crc32(data)) if checksum else b""))
        await writer.drain()
    finally:
        writer.close()


async def send_abort(addr: tuple[str, int], room: int) -> None:
    _, writer = await asyncio.open_connection(*addr)
    try:
        writer.write(pack(ABORT, room))
        await writer.drain()
    finally:
        writer.close()


class Receiver:
    """The decode server's end: serves the KV port and keeps the rooms. `fail_on_disconnect`: a connection that
    ends before its room's done notification fails the room at once (a fix); without it the room stays
    `transferring` and its request waits until its deadline (the bug: SGLang #31800's stuck receivers).
    `transfer_deadline_s` (> 0, a fix): a room bootstrapped that long ago without its done notification fails."""

    def __init__(self, fail_on_disconnect: bool, transfer_deadline_s: float = 0.0, verify: bool = False):
        self.fail_on_disconnect = fail_on_disconnect
        self.transfer_deadline_s = transfer_deadline_s
        self.verify = verify  # a done notification's CRC-32 (when it carries one) is checked against the bytes
        self.rooms: dict[int, Room] = {}
        self.counts = {"done": 0, "aborted": 0, "broken": 0, "overdue": 0, "corrupt": 0}

    def room(self, room: int) -> Room:
        r = self.rooms.get(room)
        if r is None:
            r = self.rooms[room] = Room(result=asyncio.get_running_loop().create_future())
        return r

    def forget(self, room: int) -> None:
        self.rooms.pop(room, None)

    def sweep(self, older_than_s: float) -> None:
        """Rooms nobody claimed (a transfer whose request never came) go after `older_than_s`."""
        now = time.monotonic()
        for key in [k for k, r in self.rooms.items() if now - r.created > older_than_s]:
            self.rooms.pop(key, None)

    def _finish(self, r: Room, state: str, error: Exception | None = None) -> None:
        """End the room once (a late done after a deadline, or a second abort, changes nothing)."""
        if r.state in ENDED:
            return
        r.state = state
        self.counts[state] += 1
        if r.result is not None and not r.result.done():
            if error is None:
                r.result.set_result(decode(r.meta, r.data))
            else:
                r.result.set_exception(error)

    def _overdue(self, room: int) -> None:
        r = self.rooms.get(room)
        if r is not None:
            self._finish(r, "overdue", TransferFailed(f"no done notification within {self.transfer_deadline_s:g} s "
                                                      "of the bootstrap"))

    def fail(self, room: int, why: str) -> None:
        """The router says the room's prefill failed (it could not reach it, or it answered an error)."""
        r = self.room(room)
        self._finish(r, "aborted", TransferFailed(why))

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        open_rooms: set[int] = set()
        try:
            while True:
                kind, room, n = HEAD.unpack(await reader.readexactly(HEAD.size))
                payload = await reader.readexactly(n) if n else b""
                r = self.room(room)
                if kind == BOOTSTRAP:
                    if r.state in ENDED:  # a late bootstrap of a room that ended (aborted, overdue): stays ended
                        continue
                    r.state, r.meta = "bootstrapped", json.loads(payload)
                    open_rooms.add(room)
                    if self.transfer_deadline_s > 0:
                        asyncio.get_running_loop().call_later(self.transfer_deadline_s, self._overdue, room)
                elif kind == TRANSFER:
                    if r.state not in ENDED:
                        r.state = "transferring"
                    r.data += payload
                elif kind == DONE:
                    open_rooms.discard(room)
                    if self.verify and len(payload) == 4 and struct.unpack("!I", payload)[0] != zlib.crc32(r.data):
                        self._finish(r, "corrupt", TransferFailed("the KV bytes do not match the done "
                                                                  "notification's checksum"))
                    else:
                        self._finish(r, "done")
                elif kind == ABORT:
                    open_rooms.discard(room)
                    self._finish(r, "aborted", TransferFailed("the prefill aborted the request"))
        except (asyncio.IncompleteReadError, ConnectionError, OSError, ValueError):
            pass
        finally:
            writer.close()
            for room in open_rooms:  # the connection ended before their done notification
                r = self.rooms.get(room)
                if r is not None and self.fail_on_disconnect:
                    self._finish(r, "broken", TransferFailed("the KV connection broke before the done "
                                                             "notification"))
