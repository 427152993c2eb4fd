"""The disaggregated tiny_lm's KV side channel (chaoskit.reference.pd_kv) over real loopback sockets: a transfer
arrives whole and decodes to the K/V sent; an abort fails the room; a connection that ends before its done
notification leaves the room waiting (the bug the scenarios show) unless the receiver fails it (the fix); and a
decode over transferred K/V answers what a decode that prefilled itself answers."""

from __future__ import annotations

import asyncio
import json
import struct
import zlib

import numpy as np
import pytest

from chaoskit.reference import pd_kv
from chaoskit.reference.pd_server import Engine


async def _receiver(fail_on_disconnect: bool) -> tuple[pd_kv.Receiver, asyncio.Server, tuple[str, int]]:
    rx = pd_kv.Receiver(fail_on_disconnect)
    server = await asyncio.start_server(rx.serve, "127.0.0.1", 0)
    return rx, server, server.sockets[0].getsockname()[:2]


def test_a_transfer_arrives_whole_and_an_abort_fails_its_room():
    async def main() -> None:
        rx, server, addr = await _receiver(False)
        kv = [(np.random.rand(700, 64).astype(np.float32), np.random.rand(700, 64).astype(np.float32))
              for _ in range(4)]
        meta, data = pd_kv.encode(kv)
        assert len(data) > 3 * pd_kv.PIECE  # several transfer frames
        room = rx.room(7)
        await pd_kv.send(addr, 7, meta, data)
        got = await asyncio.wait_for(room.result, 5)
        assert all(np.array_equal(a, b) for pair, sent in zip(got, kv, strict=True) for a, b in zip(pair, sent, strict=True))
        aborted = rx.room(8)
        await pd_kv.send_abort(addr, 8)
        with pytest.raises(pd_kv.TransferFailed, match="aborted"):
            await asyncio.wait_for(aborted.result, 5)
        assert rx.counts == {"done": 1, "aborted": 1, "broken": 0, "overdue": 0, "corrupt": 0}
        await pd_kv.send(addr, 8, meta, data)  # a late transfer of the aborted room: it stays aborted
        await asyncio.sleep(0.1)
        assert aborted.state == "aborted" and rx.counts["aborted"] == 1 and rx.counts["done"] == 1
        server.close()

    asyncio.run(main())


@pytest.mark.parametrize("fail_on_disconnect", [False, True])
def test_a_connection_that_ends_before_done_fails_the_room_only_when_told_to(fail_on_disconnect):
    async def main() -> None:
        rx, server, addr = await _receiver(fail_on_disconnect)
        room = rx.room(9)
        _, writer = await asyncio.open_connection(*addr)
        writer.write(pd_kv.pack(pd_kv.BOOTSTRAP, 9, b'{"layers": 1, "tokens": 1, "dim": 1}'))
        writer.write(pd_kv.pack(pd_kv.TRANSFER, 9, b"\0" * 4))
        await writer.drain()
        writer.close()  # the prefill died: no done notification
        if fail_on_disconnect:
            with pytest.raises(pd_kv.TransferFailed, match="broke before the done"):
                await asyncio.wait_for(room.result, 5)
        else:
            with pytest.raises(TimeoutError):
                await asyncio.wait_for(asyncio.shield(room.result), 0.5)
            assert room.state == "transferring"
        server.close()

    asyncio.run(main())


def test_a_transfer_whose_done_notification_never_comes_fails_at_the_deadline():
    """A lost notification (the bytes arrived, the connection stays open): the room fails transfer_deadline_s
    after its bootstrap, not at the request's waiting timeout."""
    async def main() -> None:
        rx = pd_kv.Receiver(fail_on_disconnect=True, transfer_deadline_s=0.3)
        server = await asyncio.start_server(rx.serve, "127.0.0.1", 0)
        room = rx.room(11)
        _, writer = await asyncio.open_connection(*server.sockets[0].getsockname()[:2])
        writer.write(pd_kv.pack(pd_kv.BOOTSTRAP, 11, b'{"layers": 1, "tokens": 1, "dim": 1}'))
        writer.write(pd_kv.pack(pd_kv.TRANSFER, 11, b"\0" * 4))
        await writer.drain()
        t0 = asyncio.get_running_loop().time()
        with pytest.raises(pd_kv.TransferFailed, match="no done notification within 0.3 s"):
            await asyncio.wait_for(room.result, 5)
        assert 0.2 < asyncio.get_running_loop().time() - t0 < 2 and rx.counts["overdue"] == 1
        writer.write(pd_kv.pack(pd_kv.DONE, 11))  # late: changes nothing
        await writer.drain()
        await asyncio.sleep(0.1)
        assert room.state == "overdue" and rx.counts["done"] == 0
        writer.close()
        server.close()

    asyncio.run(main())


@pytest.mark.parametrize("verify", [False, True])
def test_a_checksum_in_the_done_notification_fails_altered_bytes_only_where_checked(verify):
    async def main() -> None:
        rx = pd_kv.Receiver(False, verify=verify)
        server = await asyncio.start_server(rx.serve, "127.0.0.1", 0)
        addr = server.sockets[0].getsockname()[:2]
        good, bad = rx.room(1), rx.room(2)
        meta, data = pd_kv.encode([(np.ones((4, 8), np.float32), np.ones((4, 8), np.float32))])
        await pd_kv.send(addr, 1, meta, data, checksum=True)
        _, writer = await asyncio.open_connection(*addr)  # bytes altered on the way, the notification intact
        writer.write(pd_kv.pack(pd_kv.BOOTSTRAP, 2, json.dumps(meta).encode()))
        writer.write(pd_kv.pack(pd_kv.TRANSFER, 2, bytes(255 - b for b in data)))
        writer.write(pd_kv.pack(pd_kv.DONE, 2, struct.pack("!I", zlib.crc32(data))))
        await writer.drain()
        await asyncio.wait_for(good.result, 5)
        if verify:
            with pytest.raises(pd_kv.TransferFailed, match="checksum"):
                await asyncio.wait_for(bad.result, 5)
        else:  # decoded as it came: garbage
            got = await asyncio.wait_for(bad.result, 5)
            assert not np.array_equal(got[0][0], np.ones((4, 8), np.float32))
        writer.close()
        server.close()

    asyncio.run(main())


def test_decoding_over_transferred_kv_answers_what_a_local_prefill_answers():
    prefill, decode = Engine(), Engine()
    prompt = b"the quick brown fox jumps over the lazy dog " * 4
    meta, data = prefill.prefill(prompt, 12)
    assert decode.generate(prompt, 12, pd_kv.decode(meta, data)) == decode.generate(prompt, 12, None)
