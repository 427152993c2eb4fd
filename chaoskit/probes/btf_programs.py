"""Load bcc-compiled `tp_btf__<event>` functions as BTF raw tracepoint programs (bcc itself cannot) and attach them."""

from __future__ import annotations

import ctypes
import os
import platform
from dataclasses import dataclass, field
from typing import Any

from chaoskit.probes.kernel_btf import TYPEDEF, KernelBtf

PREFIX = b"tp_btf__"
NR_BPF = {"x86_64": 321, "aarch64": 280}
BPF_PROG_LOAD, BPF_RAW_TRACEPOINT_OPEN = 5, 17
BPF_PROG_TYPE_TRACING, BPF_TRACE_RAW_TP = 26, 23
LOG_SIZE = 1 << 16


class ProgLoadAttr(ctypes.Structure):
    """The BPF_PROG_LOAD part of union bpf_attr (include/uapi/linux/bpf.h), up to attach_btf_obj_fd."""

    _fields_ = [("prog_type", ctypes.c_uint32), ("insn_cnt", ctypes.c_uint32), ("insns", ctypes.c_uint64),
                ("license", ctypes.c_uint64), ("log_level", ctypes.c_uint32), ("log_size", ctypes.c_uint32),
                ("log_buf", ctypes.c_uint64), ("kern_version", ctypes.c_uint32), ("prog_flags", ctypes.c_uint32),
                ("prog_name", ctypes.c_char * 16), ("prog_ifindex", ctypes.c_uint32),
                ("expected_attach_type", ctypes.c_uint32), ("prog_btf_fd", ctypes.c_uint32),
                ("func_info_rec_size", ctypes.c_uint32), ("func_info", ctypes.c_uint64),
                ("func_info_cnt", ctypes.c_uint32), ("line_info_rec_size", ctypes.c_uint32),
                ("line_info", ctypes.c_uint64), ("line_info_cnt", ctypes.c_uint32),
                ("attach_btf_id", ctypes.c_uint32), ("attach_btf_obj_fd", ctypes.c_uint32)]


class RawTracepointAttr(ctypes.Structure):
    _fields_ = [("name", ctypes.c_uint64), ("prog_fd", ctypes.c_uint32), ("pad", ctypes.c_uint32)]


def bpf_syscall(cmd: int, attr: ctypes.Structure) -> int:
    nr = NR_BPF.get(platform.machine())
    if nr is None:
        raise OSError(f"no bpf() syscall number known for {platform.machine()}")
    libc = ctypes.CDLL(None, use_errno=True)
    fd = libc.syscall(ctypes.c_long(nr), ctypes.c_long(cmd), ctypes.byref(attr), ctypes.c_long(ctypes.sizeof(attr)))
    if fd < 0:
        errno = ctypes.get_errno()
        raise OSError(errno, os.strerror(errno))
    return fd


def load(bpf: Any, function: bytes, btf: KernelBtf) -> int:
    """A program fd for a function of a bcc module, verified as a tp_btf program on the event its name gives."""
    from bcc import lib  # bcc is on sys.path once the module is compiled

    event = function.removeprefix(PREFIX).decode()
    target = btf.by_name.get((TYPEDEF, f"btf_trace_{event}"))
    if target is None:
        raise OSError(f"no raw tracepoint {event} in the kernel's BTF")
    start, size = lib.bpf_function_start(bpf.module, function), lib.bpf_function_size(bpf.module, function)
    license_ = ctypes.create_string_buffer(lib.bpf_module_license(bpf.module))
    log = ctypes.create_string_buffer(LOG_SIZE)
    attr = ProgLoadAttr(prog_type=BPF_PROG_TYPE_TRACING, insn_cnt=size // 8, insns=start,
                        license=ctypes.addressof(license_),
                        prog_name=event.encode()[:15], expected_attach_type=BPF_TRACE_RAW_TP, attach_btf_id=target)
    try:
        return bpf_syscall(BPF_PROG_LOAD, attr)
    except OSError:
        attr.log_level, attr.log_size, attr.log_buf = 1, LOG_SIZE, ctypes.addressof(log)
        try:
            return bpf_syscall(BPF_PROG_LOAD, attr)
        except OSError as e:
            detail = " ".join(log.value.decode(errors="replace").splitlines()[-4:])
            raise OSError(e.errno, f"the verifier refused {event}: {e.strerror}: {detail}") from None


@dataclass
class BtfTracepoints:
    """The tp_btf programs of one bcc module: loaded once, attached and detached any number of times."""

    progs: dict[bytes, int] = field(default_factory=dict)
    links: dict[bytes, int] = field(default_factory=dict)

    @classmethod
    def load_all(cls, bpf: Any, btf: KernelBtf) -> BtfTracepoints:
        from bcc import lib

        names = [lib.bpf_function_name(bpf.module, i) for i in range(lib.bpf_num_functions(bpf.module))]
        out = cls()
        try:
            for name in names:
                if name.startswith(PREFIX):
                    out.progs[name] = load(bpf, name, btf)
        except OSError:
            out.close()
            raise
        return out

    def attach(self) -> None:
        for name, fd in self.progs.items():
            if name not in self.links:  # name 0: the event is the one the program was verified for
                self.links[name] = bpf_syscall(BPF_RAW_TRACEPOINT_OPEN, RawTracepointAttr(name=0, prog_fd=fd))

    def detach(self) -> None:
        for fd in self.links.values():
            os.close(fd)
        self.links.clear()

    def close(self) -> None:
        self.detach()
        for fd in self.progs.values():
            os.close(fd)
        self.progs.clear()
