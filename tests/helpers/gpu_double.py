"""TEST DOUBLE: a simulated GPU's memory (no GPU here) for the hold controller and fragmentation logic.

`SimulatedGpu` is a DeviceMemory (chaoskit.gpu.hold) over an address space of pages. `contiguous=True`
models an allocator whose allocations need one contiguous free range (physical fragmentation matters);
`contiguous=False` models virtual addressing, where any free pages can back one allocation. Several users
(the holder, a simulated neighbour process) share one device.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from chaoskit.gpu.hold import GRANULE


@dataclass
class SimulatedGpu:
    total: int
    contiguous: bool = False
    pages: list[int] = field(default_factory=list)  # 0 = free, else the handle owning the page
    sizes: dict[int, list[int]] = field(default_factory=dict)  # handle -> its page numbers
    next_handle: int = 1
    allocs: int = 0

    def __post_init__(self) -> None:
        self.pages = [0] * (self.total // GRANULE)

    def info(self) -> tuple[int, int]:
        return self.pages.count(0) * GRANULE, self.total

    def alloc(self, nbytes: int) -> int | None:
        need = -(-nbytes // GRANULE)
        got = self._contiguous(need) if self.contiguous else [i for i, p in enumerate(self.pages) if p == 0][:need]
        if got is None or len(got) < need:
            return None
        h, self.next_handle = self.next_handle, self.next_handle + 1
        for i in got:
            self.pages[i] = h
        self.sizes[h] = got
        self.allocs += 1
        return h

    def _contiguous(self, need: int) -> list[int] | None:
        run = 0
        for i, p in enumerate(self.pages):
            run = run + 1 if p == 0 else 0
            if run == need:
                return list(range(i - need + 1, i + 1))
        return None

    def free(self, handle: int) -> None:
        for i in self.sizes.pop(handle):
            self.pages[i] = 0

    @property
    def used(self) -> int:
        return self.total - self.info()[0]
