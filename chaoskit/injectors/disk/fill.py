"""disk.fill: fill a filesystem to a target usage with a really allocated file (not sparse); revert deletes it."""

from __future__ import annotations

import os
import uuid
from pathlib import Path
from typing import ClassVar, Literal

from pydantic import Field

from chaoskit.errors import PreflightError
from chaoskit.injectors.base import Injector, RevertRecord
from chaoskit.model.types import Percent, StrictModel
from chaoskit.targets.blockdev import resolve_path, root_disk
from chaoskit.units import format_size


def usage(path: Path) -> tuple[int, int]:
    """(used bytes, total bytes) of the filesystem holding `path`, as df counts them."""
    st = os.statvfs(path)
    total = st.f_blocks * st.f_frsize
    return total - st.f_bavail * st.f_frsize, total


class DiskFillSpec(StrictModel):
    type: Literal["disk.fill"]
    path: str = Field(min_length=1, description="a directory on the filesystem to fill; the fill file goes here")
    to: Percent = Field(description="target usage of the filesystem, e.g. '95%'")
    allow_host: bool = Field(False, description="allow filling the root filesystem")


class FillRecord(RevertRecord):
    """disk.fill's record: the file it allocates, always one named .chaoskit-fill-* (revert deletes it)."""

    file: str = Field(pattern=r"/\.chaoskit-fill-[0-9a-f]{12}$")
    bytes: int = Field(ge=0)


class DiskFill(Injector[DiskFillSpec, FillRecord]):
    type: ClassVar[str] = "disk.fill"
    summary: ClassVar[str] = "fill a filesystem to a usage percentage with an allocated file (revert: delete it)"
    Spec = DiskFillSpec
    spec: DiskFillSpec
    Record = FillRecord

    def _needed(self) -> int:
        used, total = usage(Path(self.spec.path))
        return max(0, int(self.spec.to * total) - used)

    def preflight(self) -> None:
        d = Path(self.spec.path)
        if not d.is_dir():
            raise PreflightError(f"disk.fill: {d} is not a directory")
        if not self.spec.allow_host and resolve_path(d).disk == root_disk():
            raise PreflightError(f"disk.fill: {d} is on the root filesystem's disk; set allow_host: true to fill it")

    def plan(self) -> list[str]:
        used, total = usage(Path(self.spec.path))
        return [f"write {format_size(self._needed())} into {self.spec.path}/.chaoskit-fill-* so the filesystem goes "
                f"from {used / total:.1%} to {self.spec.to:.1%} used; revert deletes the file"]

    def prepare(self) -> FillRecord:
        return FillRecord(file=str(Path(self.spec.path) / f".chaoskit-fill-{uuid.uuid4().hex[:12]}"), bytes=self._needed())

    def apply(self, record: FillRecord) -> FillRecord:
        fd = os.open(record.file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            if record.bytes:
                os.posix_fallocate(fd, 0, record.bytes)  # real blocks, not a sparse hole
        finally:
            os.close(fd)
        return record

    @classmethod
    def revert(cls, record: FillRecord) -> None:
        Path(record.file).unlink(missing_ok=True)

    @classmethod
    def observe(cls, record: FillRecord) -> bool:
        return Path(record.file).exists()
