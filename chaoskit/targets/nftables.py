"""libnftables through ctypes, JSON in and out, run inside a chosen network namespace; table names read
straight from nfnetlink (a check that must not cost a libnftables cache fill)."""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import json
import os
import socket
import struct
from collections.abc import Iterator
from typing import Any

from chaoskit.targets.netns import run_in_netns

NFT_CTX_DEFAULT = 0
NFT_CTX_OUTPUT_JSON = 1 << 4

NETLINK_NETFILTER = 12
NFT_MSG_GETTABLE = 10 << 8 | 1  # NFNL_SUBSYS_NFTABLES << 8 | NFT_MSG_GETTABLE
NLM_F_REQUEST, NLM_F_DUMP = 0x1, 0x300
NLMSG_ERROR, NLMSG_DONE = 2, 3
NFTA_TABLE_NAME = 1
NFPROTO = {"inet": 1, "ip": 2, "arp": 3, "netdev": 5, "bridge": 7, "ip6": 10}
NLMSG_HDR = struct.Struct("=IHHII")  # len, type, flags, seq, pid; then nfgenmsg (family, version, res_id)


class NftError(RuntimeError):
    """libnftables refused a command; the message is nft's own."""


def libnftables() -> ctypes.CDLL:
    name = ctypes.util.find_library("nftables") or "libnftables.so.1"
    try:
        lib = ctypes.CDLL(name)
    except OSError as e:
        raise NftError(f"libnftables not found ({e}); apt install libnftables1 (comes with nftables)") from None
    lib.nft_ctx_new.restype = ctypes.c_void_p
    lib.nft_ctx_new.argtypes = [ctypes.c_uint32]
    lib.nft_ctx_free.argtypes = [ctypes.c_void_p]
    lib.nft_ctx_output_set_flags.argtypes = [ctypes.c_void_p, ctypes.c_uint]
    for fn in (lib.nft_ctx_buffer_output, lib.nft_ctx_buffer_error):
        fn.argtypes = [ctypes.c_void_p]
        fn.restype = ctypes.c_int
    for fn in (lib.nft_ctx_get_output_buffer, lib.nft_ctx_get_error_buffer):
        fn.argtypes = [ctypes.c_void_p]
        fn.restype = ctypes.c_char_p
    lib.nft_run_cmd_from_buffer.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
    lib.nft_run_cmd_from_buffer.restype = ctypes.c_int
    return lib


def _run_here(commands: list[dict[str, Any]]) -> dict[str, Any]:
    lib = libnftables()
    ctx = lib.nft_ctx_new(NFT_CTX_DEFAULT)
    try:
        lib.nft_ctx_output_set_flags(ctx, NFT_CTX_OUTPUT_JSON)
        lib.nft_ctx_buffer_output(ctx)
        lib.nft_ctx_buffer_error(ctx)
        rc = lib.nft_run_cmd_from_buffer(ctx, json.dumps({"nftables": commands}).encode())
        out = (lib.nft_ctx_get_output_buffer(ctx) or b"").decode()
        err = (lib.nft_ctx_get_error_buffer(ctx) or b"").decode()
    finally:
        lib.nft_ctx_free(ctx)
    if rc != 0:
        raise NftError(err.strip() or f"nft failed (rc {rc})")
    return json.loads(out) if out.strip() else {}


def run(ns_path: str, commands: list[dict[str, Any]]) -> dict[str, Any]:
    """Run JSON commands (the list under "nftables") atomically in the namespace at `ns_path`."""
    return run_in_netns(ns_path, lambda: _run_here(commands))


def tables(ns_path: str) -> list[dict[str, Any]]:
    out = run(ns_path, [{"list": {"tables": None}}])
    return [x["table"] for x in out.get("nftables", []) if "table" in x]


def has_table(ns_path: str, family: str, name: str) -> bool:
    """Is there a table `family name`? Asked of the kernel directly: libnftables fills its cache first, ~4 ms
    even for one table (and ~1 ms a table to list them), which made observing many nftables faults costly."""
    return name in table_names(ns_path, family)


def table_names(ns_path: str, family: str) -> set[str]:
    """The names of the `family` tables in the namespace at `ns_path` (one nfnetlink dump, well under 1 ms)."""
    return run_in_netns(ns_path, lambda: _dump_table_names(NFPROTO[family]))


def _dump_table_names(nfproto: int) -> set[str]:
    with socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_NETFILTER) as s:
        s.bind((0, 0))
        s.send(NLMSG_HDR.pack(NLMSG_HDR.size + 4, NFT_MSG_GETTABLE, NLM_F_REQUEST | NLM_F_DUMP, 1, 0)
               + struct.pack("=BBH", nfproto, 0, 0))
        names: set[str] = set()
        while True:
            for kind, payload in _messages(s.recv(1 << 17)):
                if kind == NLMSG_DONE:
                    return names
                if kind == NLMSG_ERROR:
                    code = -struct.unpack_from("=i", payload)[0]
                    if code:
                        raise NftError(f"listing tables: {os.strerror(code)} ({errno.errorcode.get(code, code)})")
                    continue
                name = _attr(payload[4:], NFTA_TABLE_NAME)  # after the nfgenmsg
                if name is not None:
                    names.add(name.rstrip(b"\0").decode())


def _messages(data: bytes) -> Iterator[tuple[int, bytes]]:
    """(type, payload) of each netlink message in one datagram."""
    off = 0
    while off + NLMSG_HDR.size <= len(data):
        length, kind, _, _, _ = NLMSG_HDR.unpack_from(data, off)
        if length < NLMSG_HDR.size:
            return
        yield kind, data[off + NLMSG_HDR.size:off + length]
        off += (length + 3) & ~3


def _attr(data: bytes, wanted: int) -> bytes | None:
    """The value of the first netlink attribute of type `wanted` (flag bits masked off)."""
    off = 0
    while off + 4 <= len(data):
        length, kind = struct.unpack_from("=HH", data, off)
        if length < 4:
            return None
        if kind & 0x3FFF == wanted:
            return data[off + 4:off + length]
        off += (length + 3) & ~3
    return None
