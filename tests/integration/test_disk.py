"""disk.throttle on real loop devices created by the tests; path resolution on fixture sysfs trees too."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from chaoskit.errors import PreflightError
from chaoskit.injectors.disk.throttle import DiskThrottle, DiskThrottleSpec
from chaoskit.targets.blockdev import resolve_path, whole_disk
from chaoskit.targets.cgroups import IoHierarchy, find_io_hierarchy
from tests.conftest import chaoskit, hierarchy_or_skip, ledgers, wait_for, write

HELPER = Path(__file__).resolve().parent.parent / "helpers" / "direct_reader.py"
RATE = 2 * 1024 * 1024


class Reader:
    """A real process doing O_DIRECT reads; `rate(window)` is its measured throughput in bytes/s."""

    def __init__(self, dev: str):
        self.proc = subprocess.Popen([sys.executable, str(HELPER), dev], stdout=subprocess.PIPE, text=True)
        self.samples: list[tuple[float, int]] = []
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self) -> None:
        for line in self.proc.stdout:  # type: ignore[union-attr]
            t, n = line.split()
            self.samples.append((float(t), int(n)))

    def rate(self, window: float) -> float:
        time.sleep(0.3)  # let the previous regime drain
        start = len(self.samples)
        time.sleep(window)
        s = self.samples[start:]
        return (s[-1][1] - s[0][1]) / (s[-1][0] - s[0][0])

    def stop(self) -> None:
        self.proc.kill()
        self.proc.wait()


def limit_files(hier: IoHierarchy) -> str:
    names = ["io.max"] if hier.version == 2 else ["blkio.throttle.read_bps_device", "blkio.throttle.write_bps_device"]
    return "".join((hier.root / n).read_text() for n in names if (hier.root / n).exists())


def test_throttle_holds_direct_reads_and_revert_restores(loopdev):
    hier = find_io_hierarchy()
    reader = Reader(loopdev)
    try:
        home = hier.cgroup_of(reader.proc.pid)
        before_limits = limit_files(hier)
        wait_for(lambda: len(reader.samples) > 2)
        full = reader.rate(1.0)
        inj = DiskThrottle(DiskThrottleSpec(type="disk.throttle", path=loopdev, rbps="2MiB", pid=reader.proc.pid))
        inj.preflight()
        record = inj.apply(inj.prepare())
        assert DiskThrottle.observe(record)
        throttled = reader.rate(3.0)
        DiskThrottle.revert(record)
        DiskThrottle.revert(record)  # idempotent
        after = reader.rate(1.0)
        print(f"\nO_DIRECT reads on {loopdev}: full {full / 1e6:.1f} MB/s, throttled {throttled / 1e6:.3f} MB/s "
              f"(limit {RATE / 1e6:.3f}), after revert {after / 1e6:.1f} MB/s")
        assert abs(throttled - RATE) / RATE < 0.10
        assert after > 5 * RATE
        assert hier.cgroup_of(reader.proc.pid) == home
        assert not record.path.exists() and limit_files(hier) == before_limits
    finally:
        reader.stop()


def test_existing_cgroup_limit_lines_restored_exactly(loopdev, tmp_path):
    hier = find_io_hierarchy()
    cg = hier.root / f"chaoskit-test-{os.getpid()}"
    cg.mkdir()
    try:
        major_minor = whole_disk(f"{os.major(os.stat(loopdev).st_rdev)}:{os.minor(os.stat(loopdev).st_rdev)}")[0]
        hier.write_limits(cg, major_minor, {"rbps": "5000000"})
        before = hier.read_limits(cg, major_minor)
        inj = DiskThrottle(DiskThrottleSpec(type="disk.throttle", path=loopdev, rbps="1MiB", wiops=50,
                                            cgroup=cg.name))
        record = inj.apply(inj.prepare())
        assert hier.read_limits(cg, major_minor)["rbps"] == str(1024 * 1024)
        DiskThrottle.revert(record)
        assert hier.read_limits(cg, major_minor) == before
    finally:
        os.rmdir(cg)


EXPERIMENT = """\
apiVersion: chaoskit/v1
kind: Experiment
metadata: {{name: disk}}
steadyState:
  probes: [{{name: t, type: command, argv: ["true"], phases: [before]}}]
  during: null
method:
  - inject: {{type: disk.throttle, path: {dev}, rbps: 2MiB, pid: {pid}}}
    duration: 60s
"""


def test_sigkill_watchdog_restores(loopdev, tmp_path, state_dir):
    hier = find_io_hierarchy()
    reader = Reader(loopdev)
    try:
        home = hier.cgroup_of(reader.proc.pid)
        exp = write(tmp_path / "e.yaml", EXPERIMENT.format(dev=loopdev, pid=reader.proc.pid))
        run = chaoskit("run", str(exp), "--out", str(tmp_path / "o"), state=state_dir)
        wait_for(lambda: hier.cgroup_of(reader.proc.pid) != home, timeout=20)
        run.kill()
        run.wait()
        took = wait_for(lambda: hier.cgroup_of(reader.proc.pid) == home, timeout=5)
        assert took < 2.0
        wait_for(lambda: not any(p.name.startswith("chaoskit-") and p.is_dir() for p in hier.root.iterdir()), 3)
        assert ledgers(state_dir)
    finally:
        reader.stop()


def test_resolution_of_a_file_on_a_mounted_loop_device(loopdev, mounted):
    (mounted / "weights.bin").write_bytes(b"x" * 4096)
    t = resolve_path(mounted / "weights.bin")
    st = os.stat(loopdev)
    assert t.disk == f"{os.major(st.st_rdev)}:{os.minor(st.st_rdev)}" and t.mount_point == str(mounted)
    assert t.fs_type == "ext4" and any("backed by" in n for n in t.notes)


def test_refuses_root_disk_and_zero_limits():
    hierarchy_or_skip()
    with pytest.raises(PreflightError, match="root filesystem"):
        DiskThrottle(DiskThrottleSpec(type="disk.throttle", path="/", rbps="1MiB", pid=os.getpid())).preflight()
    with pytest.raises(ValueError, match="stop all I/O"):
        DiskThrottleSpec(type="disk.throttle", path="/", rbps=0, pid=1)
    with pytest.raises(PreflightError, match="no block device"):
        resolve_path("/proc/self")


def _fake_sysfs(root: Path) -> Path:
    """A fixture sysfs tree (named as such) for devices that do not exist here: NVMe partition, sd partition, dm."""
    devs = {
        "259:2": "devices/pci0000:00/nvme/nvme0/nvme0n1/nvme0n1p2",
        "8:17": "devices/pci0000:00/ata1/block/sdb/sdb1",
        "253:3": "devices/virtual/block/dm-3",
    }
    for dev, rel in devs.items():
        node = root / rel
        node.mkdir(parents=True)
        (node / "dev").write_text(dev + "\n")
        (root / "dev" / "block").mkdir(parents=True, exist_ok=True)
        (root / "dev" / "block" / dev).symlink_to(node)
    for part in ("devices/pci0000:00/nvme/nvme0/nvme0n1/nvme0n1p2", "devices/pci0000:00/ata1/block/sdb/sdb1"):
        (root / part / "partition").write_text("1\n")
    (root / "devices/pci0000:00/nvme/nvme0/nvme0n1/dev").write_text("259:0\n")
    (root / "devices/pci0000:00/ata1/block/sdb/dev").write_text("8:16\n")
    dm = root / "devices/virtual/block/dm-3"
    (dm / "slaves" / "nvme0n1p2").mkdir(parents=True)
    (dm / "dm").mkdir()
    (dm / "dm" / "name").write_text("vg-models\n")
    return root


def test_fixture_sysfs_partitions_nvme_and_dm(tmp_path):
    sysfs = _fake_sysfs(tmp_path / "sys")
    assert whole_disk("259:2", sysfs)[:2] == ("259:0", "nvme0n1")
    assert whole_disk("8:17", sysfs)[:2] == ("8:16", "sdb")
    disk, name, notes = whole_disk("253:3", sysfs)
    assert (disk, name) == ("253:3", "dm-3") and "vg-models" in notes[0] and "nvme0n1p2" in notes[0]
    with pytest.raises(PreflightError):
        whole_disk("1:99", sysfs)


def test_v2_io_max_lines_written_and_restored(tmp_path):
    """cgroup v2 has no io controller on this machine: check the exact io.max lines against a fixture cgroup
    directory (plain files standing in for the kernel's), the path a v2 node takes."""
    hier = IoHierarchy(2, tmp_path)
    cg = tmp_path / "svc"
    cg.mkdir()
    (cg / "io.max").write_text("7:3 rbps=100 wbps=max riops=max wiops=max\n")
    assert hier.read_limits(cg, "7:3")["rbps"] == "100"
    hier.write_limits(cg, "7:3", {"rbps": "2097152", "wiops": "50"})
    assert (cg / "io.max").read_text() == "7:3 rbps=2097152 wiops=50\n"
    assert hier.read_limits(cg, "8:0") == {"rbps": "max", "wbps": "max", "riops": "max", "wiops": "max"}


def test_disk_fill_on_a_loop_filesystem(mounted):
    from chaoskit.injectors.disk.fill import DiskFill, DiskFillSpec, usage

    before = usage(mounted)
    inj = DiskFill(DiskFillSpec(type="disk.fill", path=str(mounted), to="90%"))
    inj.preflight()
    record = inj.apply(inj.prepare())
    used, total = usage(mounted)
    assert 0.88 < used / total <= 0.91 and DiskFill.observe(record)
    DiskFill.revert(record)
    DiskFill.revert(record)
    assert usage(mounted) == before and not DiskFill.observe(record)
    with pytest.raises(PreflightError, match="root filesystem"):
        DiskFill(DiskFillSpec(type="disk.fill", path="/tmp", to="50%")).preflight()
