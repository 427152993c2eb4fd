"""The running kernel's BTF (/sys/kernel/btf/vmlinux): struct member offsets and raw tracepoint argument types."""

from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path

VMLINUX = Path("/sys/kernel/btf/vmlinux")
MAGIC = 0xEB9F
INT, PTR, ARRAY, STRUCT, UNION, ENUM, FWD, TYPEDEF, VOLATILE, CONST, RESTRICT = range(1, 12)
FUNC, FUNC_PROTO, VAR, DATASEC, FLOAT, DECL_TAG, TYPE_TAG, ENUM64 = range(12, 20)
MODIFIERS = (TYPEDEF, VOLATILE, CONST, RESTRICT, TYPE_TAG)
# bytes after the 12-byte common header: (fixed, per vlen item)
TRAILER = {INT: (4, 0), ARRAY: (12, 0), STRUCT: (0, 12), UNION: (0, 12), ENUM: (0, 8), FUNC_PROTO: (0, 8),
           VAR: (4, 0), DATASEC: (0, 12), DECL_TAG: (4, 0), ENUM64: (0, 12)}


@dataclass(frozen=True)
class Member:
    name: str
    type_id: int
    bit_offset: int
    bitfield_size: int


class KernelBtf:
    """An index of the type section: kind, name and where each type's trailing data starts."""

    def __init__(self, data: bytes):
        magic, _version, _flags, hdr_len, type_off, type_len, str_off, _str_len = struct.unpack_from("<HBBIIIII",
                                                                                                     data)
        if magic != MAGIC:
            raise ValueError("not a little-endian BTF blob")
        self.data = data
        self.strings = hdr_len + str_off
        self.types: list[tuple[int, int, int, int, int]] = [(0, 0, 0, 0, 0)]  # kind, name_off, vlen, size/type, at
        self.by_name: dict[tuple[int, str], int] = {}
        at, end = hdr_len + type_off, hdr_len + type_off + type_len
        while at < end:
            name_off, info, size_type = struct.unpack_from("<III", data, at)
            kind, vlen = (info >> 24) & 0x1F, info & 0xFFFF
            self.types.append((kind, name_off, vlen, size_type, at + 12))
            if kind in (STRUCT, UNION, TYPEDEF) and name_off:
                self.by_name.setdefault((kind, self.name(name_off)), len(self.types) - 1)
            fixed, each = TRAILER.get(kind, (0, 0))
            at += 12 + fixed + each * vlen

    @classmethod
    def load(cls, path: Path = VMLINUX) -> KernelBtf:
        return cls(path.read_bytes())

    def name(self, off: int) -> str:
        start = self.strings + off
        return self.data[start:self.data.index(b"\0", start)].decode()

    def members(self, type_id: int) -> list[Member]:
        kind, _, vlen, _, at = self.types[type_id]
        bitfields = bool(struct.unpack_from("<I", self.data, at - 8)[0] >> 31)
        out = []
        for i in range(vlen):
            name_off, member_type, offset = struct.unpack_from("<III", self.data, at + 12 * i)
            bits, size = (offset & 0xFFFFFF, offset >> 24) if bitfields else (offset, 0)
            out.append(Member(self.name(name_off) if name_off else "", member_type, bits, size))
        return out

    def strip(self, type_id: int) -> int:
        while self.types[type_id][0] in MODIFIERS:
            type_id = self.types[type_id][3]
        return type_id

    def _find(self, type_id: int, name: str) -> tuple[int, Member] | None:
        """(bit offset, member) of `name` in a struct or union, looking into its anonymous members too."""
        for m in self.members(type_id):
            if m.name == name:
                return m.bit_offset, m
            inner = self.strip(m.type_id)
            if not m.name and self.types[inner][0] in (STRUCT, UNION):
                found = self._find(inner, name)
                if found:
                    return m.bit_offset + found[0], found[1]
        return None

    def size(self, type_id: int) -> int:
        kind, _, _, size, at = self.types[self.strip(type_id)]
        if kind == PTR:
            return 8
        if kind == ARRAY:
            elem, _, count = struct.unpack_from("<III", self.data, at)
            return count * self.size(elem)
        return size

    def member(self, struct_name: str, path: str) -> tuple[int, int]:
        """(byte offset, size) of a (dotted) member path in `struct struct_name`; bitfields are refused."""
        type_id = self.by_name.get((STRUCT, struct_name))
        if type_id is None:
            raise LookupError(f"no struct {struct_name} in the kernel's BTF")
        total = 0
        for part in path.split("."):
            found = self._find(type_id, part)
            if found is None:
                raise LookupError(f"struct {struct_name} has no member {path}")
            bits, member = found
            if member.bitfield_size or bits % 8:
                raise LookupError(f"{struct_name}.{path} is a bitfield")
            total += bits // 8
            type_id = self.strip(member.type_id)
        return total, self.size(type_id)

    def describe(self, type_id: int) -> str:
        """A short C-like spelling: 'struct task_struct *', 'int', 'bool'."""
        type_id = self.strip(type_id)
        kind, name_off, _, target, _ = self.types[type_id]
        if kind == PTR:
            return self.describe(target) + " *"
        if type_id == 0:
            return "void"
        prefix = {STRUCT: "struct ", UNION: "union ", ENUM: "enum ", ENUM64: "enum "}.get(kind, "")
        return prefix + (self.name(name_off) if name_off else "?")

    def tracepoint_args(self, event: str) -> list[str]:
        """The argument types of a raw tracepoint (its TP_PROTO), from the btf_trace_<event> typedef."""
        type_id = self.by_name.get((TYPEDEF, f"btf_trace_{event}"))
        if type_id is None:
            raise LookupError(f"no raw tracepoint {event} in the kernel's BTF")
        proto = self.strip(self.types[self.strip(type_id)][3])
        _, _, vlen, _, at = self.types[proto]
        params = [struct.unpack_from("<II", self.data, at + 8 * i)[1] for i in range(vlen)]
        return [self.describe(t) for t in params[1:]]  # the first is the probe's `void *data`
