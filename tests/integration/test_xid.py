"""gpu.xid and kernel_log for real: lines written to /dev/kmsg, read back by `dmesg` and by the probe."""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import subprocess
from pathlib import Path

import pytest

from chaoskit.errors import PreflightError
from chaoskit.injectors.gpu.xid import XidEvent, XidSpec, driver_pci
from chaoskit.probes.kernel_log import KernelLogProbe, KernelLogProbeSpec
from tests.conftest import chaoskit
from tests.helpers.gpu_host import writes_xid


def _kmsg_missing() -> str | None:
    if os.geteuid() != 0:
        return "needs root to write /dev/kmsg"
    try:
        os.close(os.open("/dev/kmsg", os.O_WRONLY))
    except OSError as e:
        return f"/dev/kmsg is not writable here: {e.strerror}"
    return None


KMSG_MISSING = _kmsg_missing()
pytestmark = [pytest.mark.root,
              pytest.mark.skipif(KMSG_MISSING is not None, reason=str(KMSG_MISSING))]

EXPERIMENT = "experiments/gpu/xid-79-detector-check.yaml"


def unique_bus() -> str:
    """A fake PCI bus id no other test (or earlier run) has written: lines from elsewhere never match."""
    return f"{0x1000 + secrets.randbelow(0xE000):04x}:{secrets.randbelow(256):02x}:{secrets.randbelow(32):02x}.0"


def injector(bus: str, **kw) -> XidEvent:
    return XidEvent(XidSpec.model_validate({"type": "gpu.xid", "pci_bus_id": bus, "xid": 79, **kw}))


def inject(bus: str, **kw) -> dict:
    inj = injector(bus, **kw)
    inj.preflight()
    return inj.apply(inj.prepare())


def probe_for(bus: str, xid: int = 79) -> KernelLogProbe:
    p = KernelLogProbe(KernelLogProbeSpec.model_validate(
        {"name": "xid", "type": "kernel_log", "pattern": rf"NVRM: Xid \(PCI:{driver_pci(bus)}\): {xid},"}))
    p.preflight()
    return p


def measure(p: KernelLogProbe) -> dict:
    return asyncio.run(p.measure())


@writes_xid
def test_apply_writes_a_line_dmesg_shows():
    bus = unique_bus()
    record = inject(bus, pid=4242, process_name="python3")
    expected = (f"NVRM: Xid (PCI:{driver_pci(bus)}): 79, pid=4242, name=python3, GPU has fallen off the bus.")
    assert record.event is True and record.pci_bus_id == bus
    [w] = [w.model_dump() for w in record.written]
    assert w["line"] == expected and isinstance(w["seq"], int) and w["at"] > 0
    dmesg = subprocess.run(["dmesg"], capture_output=True, text=True, check=True).stdout
    assert [line for line in dmesg.splitlines() if driver_pci(bus) in line] == \
        [line for line in dmesg.splitlines() if line.endswith("] " + expected)]
    assert sum(line.endswith("] " + expected) for line in dmesg.splitlines()) == 1
    XidEvent.revert(record)  # an event: revert succeeds and changes nothing
    assert XidEvent.observe(record) is False


@writes_xid
def test_repeated_lines_get_increasing_sequence_numbers():
    record = inject(unique_bus(), xid=48, count=3, interval="50ms")
    seqs = [w.seq for w in record.written]
    assert len(seqs) == 3 and seqs == sorted(set(seqs))
    times = [w.at for w in record.written]
    assert all(b - a >= 0.045 for a, b in zip(times, times[1:], strict=False))
    assert all(w.line.endswith("): 48, pid='<unknown>', name=<unknown>, Double Bit ECC Error")
               for w in record.written)


@writes_xid
def test_probe_counts_exactly_the_lines_written_after_it_started():
    bus = unique_bus()
    inject(bus)  # before the probe started: never counted
    p = probe_for(bus)
    try:
        inject(bus)
        first = measure(p)
        assert (first["count"], first["total"], first["xid"]) == (1, 1, 79)
        assert first["last_match"].startswith(f"NVRM: Xid (PCI:{driver_pci(bus)}): 79, ")
        assert first["lines"] >= 1 and first["lost"] == 0
        inject(bus, count=3)
        inject(unique_bus())  # another GPU: read, not matched
        second = measure(p)
        assert (second["count"], second["total"]) == (3, 4) and second["lines"] >= 4
        quiet = measure(p)
        assert (quiet["count"], quiet["total"], quiet["xid"]) == (0, 4, 79)
    finally:
        asyncio.run(p.close())
    assert p.tail is None


@writes_xid
def test_probe_for_another_xid_counts_nothing():
    bus = unique_bus()
    p = probe_for(bus, xid=48)
    try:
        inject(bus)
        got = measure(p)
        assert (got["count"], got["total"], got["last_match"], got["xid"]) == (0, 0, None, None)
    finally:
        asyncio.run(p.close())


def test_not_root_is_a_preflight_error():
    """A forked child that drops to uid nobody runs preflight for real and reports the message back."""
    inj = injector(unique_bus())
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # child: never returns into pytest
        try:
            os.setgid(65534)
            os.setuid(65534)
            inj.preflight()
            os.write(w, b"no error")
        except PreflightError as e:
            os.write(w, str(e).encode())
        except BaseException as e:  # noqa: BLE001 - anything else is reported, not raised
            os.write(w, repr(e).encode())
        finally:
            os._exit(0)
    os.close(w)
    with os.fdopen(r, "rb") as f:
        message = f.read().decode()
    os.waitpid(pid, 0)
    assert message == "gpu.xid: cannot write /dev/kmsg: Permission denied (needs root)"


def test_preflight_error_type():
    with pytest.raises(PreflightError, match="kernel_log: cannot read"):
        KernelLogProbe(KernelLogProbeSpec.model_validate(
            {"name": "x", "type": "kernel_log", "pattern": "x", "source": "/nonexistent/kmsg"})).preflight()


def _run(tmp_path: Path, state: Path, name: str, *variables: str) -> tuple[int, dict, str]:
    args = [a for v in variables for a in ("--var", v)]
    run = chaoskit("run", EXPERIMENT, *args, "--out", str(tmp_path / name), "--plain", state=state)
    out, err = run.communicate(timeout=60)
    summary = json.loads((tmp_path / name / "summary.json").read_text())
    return run.returncode, summary, out + err


@writes_xid
def test_experiment_holds_when_the_detector_sees_the_xid(tmp_path, state_dir):
    bus = unique_bus()
    rc, s, log = _run(tmp_path, state_dir, "held", f"bus={bus}", f"watch_bus={driver_pci(bus)}")
    assert rc == 0, log
    assert s["verdict"] == "held" and s["exit_code"] == 0 and s["rollback_complete"]
    during = [x for x in s["samples"] if x["phase"] == "during"]
    assert during and all(x["verdict"] == "ok" and x["values"]["total"] == 1 for x in during)
    assert during[0]["values"]["count"] == 1 and during[0]["values"]["xid"] == 79
    assert [f["type"] for f in s["faults"]] == ["gpu.xid"] and s["faults"][0]["reverted_at"]


@writes_xid
@pytest.mark.parametrize("miss", ["watch_xid=48", "other_bus"])
def test_experiment_deviates_when_the_detector_misses_it(tmp_path, state_dir, miss):
    bus = unique_bus()
    watch = f"watch_bus={driver_pci(unique_bus())}" if miss == "other_bus" else f"watch_bus={driver_pci(bus)}"
    extra = [miss] if miss != "other_bus" else []
    rc, s, log = _run(tmp_path, state_dir, "deviated", f"bus={bus}", watch, *extra)
    assert rc == 1, log
    assert s["verdict"] == "deviated" and s["exit_code"] == 1 and s["rollback_complete"]
    assert any("xid-detector deviated during the method: total: 0 >= 1 is false" in d for d in s["deviations"])
    during = [x for x in s["samples"] if x["phase"] == "during"]
    assert during and all(x["verdict"] == "fail" and x["values"]["total"] == 0 for x in during)
