"""The one place chaoskit calls the CUDA driver API: ctypes on libcuda.so.1, no framework.

Only what memory pressure needs: cuInit, device lookup, the primary context, cuMemAlloc_v2 / cuMemFree_v2 and
cuMemGetInfo_v2. `$CHAOSKIT_LIBCUDA` names another library file (a driver in an odd place, or the simulated
driver the tests build).
"""

from __future__ import annotations

import ctypes
import os
from dataclasses import dataclass

from chaoskit.errors import PreflightError

CUDA_SUCCESS = 0
CUDA_ERROR_OUT_OF_MEMORY = 2
GRANULE = 2 << 20  # the driver maps device memory in 2 MiB pages; sizes are rounded up to this


class CudaError(RuntimeError):
    def __init__(self, call: str, code: int, name: str):
        self.code = code
        super().__init__(f"{call} failed: {name} ({code})")


def library_path() -> str:
    return os.environ.get("CHAOSKIT_LIBCUDA", "libcuda.so.1")


def round_up(n: int) -> int:
    return -(-n // GRANULE) * GRANULE


@dataclass(frozen=True)
class DeviceFacts:
    ordinal: int
    name: str
    uuid: str  # GPU-xxxxxxxx-... as NVML and nvidia-smi print it
    total: int


class Driver:
    """A loaded libcuda with cuInit done. `open_device` makes one device's primary context current."""

    def __init__(self, path: str | None = None):
        path = path or library_path()
        try:
            self.lib = ctypes.CDLL(path)
        except OSError as e:
            raise PreflightError(f"no libcuda: {e} (no NVIDIA driver?)") from None
        self._declare()
        try:
            self._check("cuInit", self.lib.cuInit(0))
        except CudaError as e:
            raise PreflightError(f"no usable CUDA driver: {e}") from None
        self._ctx_device: int | None = None

    def _declare(self) -> None:
        c, L = ctypes, self.lib
        sigs = {
            "cuInit": [c.c_uint], "cuDeviceGetCount": [c.POINTER(c.c_int)],
            "cuDeviceGet": [c.POINTER(c.c_int), c.c_int], "cuDeviceGetName": [c.c_char_p, c.c_int, c.c_int],
            "cuDeviceGetUuid_v2": [c.c_char * 16, c.c_int], "cuDeviceTotalMem_v2": [c.POINTER(c.c_size_t), c.c_int],
            "cuDevicePrimaryCtxRetain": [c.POINTER(c.c_void_p), c.c_int],
            "cuDevicePrimaryCtxRelease_v2": [c.c_int], "cuCtxSetCurrent": [c.c_void_p],
            "cuMemAlloc_v2": [c.POINTER(c.c_uint64), c.c_size_t], "cuMemFree_v2": [c.c_uint64],
            "cuMemGetInfo_v2": [c.POINTER(c.c_size_t), c.POINTER(c.c_size_t)],
            "cuGetErrorName": [c.c_int, c.POINTER(c.c_char_p)],
        }
        for name, args in sigs.items():
            try:
                fn = getattr(L, name)
            except AttributeError:
                raise PreflightError(f"no usable CUDA driver: {library_path()} lacks {name}") from None
            fn.argtypes, fn.restype = args, c.c_int

    def _check(self, call: str, code: int) -> None:
        if code != CUDA_SUCCESS:
            name = ctypes.c_char_p()
            self.lib.cuGetErrorName(code, ctypes.byref(name))
            raise CudaError(call, code, (name.value or b"CUDA_ERROR_UNKNOWN").decode())

    def device_count(self) -> int:
        n = ctypes.c_int()
        self._check("cuDeviceGetCount", self.lib.cuDeviceGetCount(ctypes.byref(n)))
        return n.value

    def facts(self, ordinal: int) -> DeviceFacts:
        dev = ctypes.c_int()
        self._check("cuDeviceGet", self.lib.cuDeviceGet(ctypes.byref(dev), ordinal))
        name = ctypes.create_string_buffer(256)
        self._check("cuDeviceGetName", self.lib.cuDeviceGetName(name, 256, dev.value))
        raw = (ctypes.c_char * 16)()
        self._check("cuDeviceGetUuid_v2", self.lib.cuDeviceGetUuid_v2(raw, dev.value))
        total = ctypes.c_size_t()
        self._check("cuDeviceTotalMem_v2", self.lib.cuDeviceTotalMem_v2(ctypes.byref(total), dev.value))
        return DeviceFacts(ordinal, name.value.decode(errors="replace"), format_uuid(bytes(raw)), total.value)

    def open_device(self, ordinal: int) -> None:
        """Retain the device's primary context and make it current on this thread."""
        dev = ctypes.c_int()
        self._check("cuDeviceGet", self.lib.cuDeviceGet(ctypes.byref(dev), ordinal))
        ctx = ctypes.c_void_p()
        self._check("cuDevicePrimaryCtxRetain", self.lib.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev.value))
        self._check("cuCtxSetCurrent", self.lib.cuCtxSetCurrent(ctx))
        self._ctx_device = dev.value

    def close(self) -> None:
        if self._ctx_device is not None:
            self.lib.cuDevicePrimaryCtxRelease_v2(self._ctx_device)
            self._ctx_device = None

    # -- the allocator interface the hold controller uses (chaoskit.gpu.hold.DeviceMemory) --------------
    def info(self) -> tuple[int, int]:
        """(free, total) bytes of the current context's device, as the driver sees it now."""
        free, total = ctypes.c_size_t(), ctypes.c_size_t()
        self._check("cuMemGetInfo_v2", self.lib.cuMemGetInfo_v2(ctypes.byref(free), ctypes.byref(total)))
        return free.value, total.value

    def alloc(self, nbytes: int) -> int | None:
        """A device pointer, or None when the device is out of memory (any other error raises)."""
        ptr = ctypes.c_uint64()
        code = self.lib.cuMemAlloc_v2(ctypes.byref(ptr), nbytes)
        if code == CUDA_ERROR_OUT_OF_MEMORY:
            return None
        self._check("cuMemAlloc_v2", code)
        return ptr.value

    def free(self, ptr: int) -> None:
        self._check("cuMemFree_v2", self.lib.cuMemFree_v2(ptr))


def format_uuid(raw: bytes) -> str:
    h = raw.hex()
    return f"GPU-{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:32]}"


def visible_devices_env(device: int | str) -> dict[str, str]:
    """Environment that makes `device` (index in nvidia-smi order, GPU- or MIG- UUID) CUDA ordinal 0."""
    return {"CUDA_VISIBLE_DEVICES": str(device), "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}
