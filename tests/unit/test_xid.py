"""gpu.xid line format and spec; kernel_log record parsing, spec and file source (no /dev/kmsg needed)."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

import pytest
from pydantic import ValidationError

from chaoskit.errors import PreflightError, SpecError
from chaoskit.experiment.loader import load_experiment
from chaoskit.injectors.gpu.xid import (
    XID_MESSAGES,
    XidEvent,
    XidSpec,
    canonical_bus_id,
    driver_pci,
    parse_bus_id,
    xid_line,
)
from chaoskit.probes.kernel_log import KernelLogProbe, KernelLogProbeSpec, parse_record, unescape, xid_of

# what XID detectors match on (NVSentinel, gpud, dcgm-style dmesg scrapers)
DETECTOR_RE = re.compile(r"NVRM: Xid \(PCI:([0-9a-fA-F:.]+)\): (\d+),")


def spec(**kw) -> XidSpec:
    return XidSpec.model_validate({"type": "gpu.xid", **kw})


def test_line_is_the_driver_format_detectors_match():
    line = XidEvent(spec(pci_bus_id="0000:3b:00.0", xid=79)).lines()[0]
    assert line == "NVRM: Xid (PCI:0000:3b:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus."
    m = DETECTOR_RE.search(line)
    assert m and m.groups() == ("0000:3b:00", "79")


def test_line_with_pid_name_and_message():
    line = xid_line("00000000:3B:00.0", 13, "Graphics SM Warp Exception", pid=4242, process_name="python3")
    assert line == "NVRM: Xid (PCI:0000:3b:00): 13, pid=4242, name=python3, Graphics SM Warp Exception"
    assert DETECTOR_RE.search(line).groups() == ("0000:3b:00", "13")


@pytest.mark.parametrize("given,canonical,printed", [
    ("0000:3b:00.0", "0000:3b:00.0", "0000:3b:00"),
    ("00000000:3B:00.0", "0000:3b:00.0", "0000:3b:00"),  # NVML's form
    ("3b:00.1", "0000:3b:00.1", "0000:3b:00"),
    ("cafe:79:1f", "cafe:79:1f.0", "cafe:79:1f"),
])
def test_bus_id_forms(given, canonical, printed):
    assert canonical_bus_id(given) == canonical
    assert driver_pci(given) == printed


@pytest.mark.parametrize("bad", ["0000:ck:00.0", "3b:00.8", "0000:3b:20.0", "3b", "", "0000:3b:00.0 x",
                                 "123456789:3b:00.0"])
def test_bad_bus_id_is_a_spec_error(bad):
    with pytest.raises(ValidationError, match="pci_bus_id"):
        spec(pci_bus_id=bad, xid=79)
    with pytest.raises(ValueError):
        parse_bus_id(bad)


@pytest.mark.parametrize("xid", [0, 256, -1])
def test_xid_out_of_range(xid):
    with pytest.raises(ValidationError, match="xid"):
        spec(pci_bus_id="0000:3b:00.0", xid=xid)


def test_other_spec_errors():
    with pytest.raises(ValidationError, match="Extra inputs"):
        spec(pci_bus_id="0000:3b:00.0", xid=79, gpu=0)
    with pytest.raises(ValidationError, match="exactly one of pci_bus_id"):
        spec(xid=79)
    with pytest.raises(ValidationError, match="exactly one of pci_bus_id"):
        spec(xid=79, pci_bus_id="0000:3b:00.0", device=0)
    with pytest.raises(ValidationError, match="xid 200 has no default message"):
        spec(pci_bus_id="0000:3b:00.0", xid=200)
    with pytest.raises(ValidationError, match="one line"):
        spec(pci_bus_id="0000:3b:00.0", xid=79, message="two\nlines")
    with pytest.raises(ValidationError, match="count"):
        spec(pci_bus_id="0000:3b:00.0", xid=79, count=0)
    with pytest.raises(ValidationError, match="level"):
        spec(pci_bus_id="0000:3b:00.0", xid=79, level=8)
    assert spec(pci_bus_id="0000:3b:00.0", xid=200, message="custom").text() == "custom"


def test_default_messages():
    assert sorted(XID_MESSAGES) == [13, 31, 43, 45, 48, 61, 62, 63, 64, 74, 79, 92, 94, 95, 119, 120]
    assert XID_MESSAGES[79] == "GPU has fallen off the bus."
    assert XID_MESSAGES[48] == "Double Bit ECC Error"
    for xid, text in XID_MESSAGES.items():
        line = XidEvent(spec(pci_bus_id="0000:3b:00.0", xid=xid)).lines()[0]
        assert line.endswith(", " + text) and DETECTOR_RE.search(line).group(2) == str(xid)
        assert len(text) <= 60


def test_plan_record_and_revert_are_an_event():
    inj = XidEvent(spec(pci_bus_id="0000:3b:00.0", xid=79, count=3, interval="100ms", level=3))
    plan = inj.plan()
    assert plan[0] == ("write to /dev/kmsg at priority 3, 3 times, 0.1s apart: NVRM: Xid (PCI:0000:3b:00): 79, "
                       "pid='<unknown>', name=<unknown>, GPU has fallen off the bus.")
    assert "revert: nothing" in plan[1]
    record = inj.prepare()
    assert record.event is True and "cannot be taken back" in record.note
    assert record.pci_bus_id == "0000:3b:00.0" and len(record.lines) == 3 and record.written == []
    assert XidEvent.read_record(record.to_json()) == record  # the record as prepare writes it reads back
    XidEvent.revert(record)
    XidEvent.revert(record)  # idempotent: nothing to do, ever
    assert XidEvent.observe(record) is False
    written = XidEvent.read_record({**record.to_json(), "written": [{"line": record.lines[0], "at": 1.0, "seq": 7}]})
    assert XidEvent.observe_details(written) == {"in_effect": False, "event": True, "lines_written": 1, "seq": [7]}


def test_device_needs_nvml():
    from chaoskit.gpu import nvml

    try:
        nvml.devices()
    except PreflightError:
        pass
    else:
        pytest.skip("NVML is present here: the device is resolved for real")
    inj = XidEvent(spec(device=0, xid=79))
    with pytest.raises(PreflightError, match=r"^gpu\.xid: no NVML: "):
        inj.bus_id()


# ---------------------------------------------------------------------------- kernel_log


def test_parse_kmsg_record():
    raw = b"12,338,300892790,-;NVRM: Xid (PCI:cafe:79:00): 79, pid='<unknown>', name=<unknown>, " \
          b"GPU has fallen off the bus.\n SUBSYSTEM=pci\n"
    seq, msg = parse_record(raw)
    assert seq == 338 and msg.endswith("GPU has fallen off the bus.") and xid_of(msg) == 79
    assert parse_record(b"garbage") is None
    assert unescape(b"back\\x5cslash \\xc3\\xa9 tab\\x09here") == "back\\slash \u00e9 tab\there"


def test_xid_of():
    assert xid_of("NVRM: Xid (PCI:0000:3b:00): 13, pid=1, name=x, Graphics") == 13
    assert xid_of("NVRM: Xid (PCI:0000:3b:00 GPU-I:01): 31, pid=1, name=x, MMU") == 31
    assert xid_of("Out of memory: Killed process 4242 (python3)") is None


def test_bad_regex_is_a_spec_error_with_position(tmp_path: Path):
    f = tmp_path / "exp.yaml"
    f.write_text("""\
apiVersion: chaoskit/v1
kind: Experiment
metadata: {name: bad-regex}
steadyState:
  probes:
    - name: log
      type: kernel_log
      pattern: "NVRM: Xid \\\\(PCI:("
method:
  - inject: {type: gpu.xid, pci_bus_id: "0000:3b:00.0", xid: 79}
    duration: 1s
""")
    with pytest.raises(SpecError) as e:
        load_experiment(f)
    text = str(e.value)
    assert "exp.yaml:" in text and "pattern" in text and "not a valid regular expression" in text


def test_expect_keys():
    KernelLogProbeSpec.model_validate({"name": "x", "type": "kernel_log", "pattern": "x",
                                       "expect": {"count": ">= 1", "total": ">= 1", "xid": 79, "lost": 0}})
    with pytest.raises(ValidationError, match="unknown key 'matches'"):
        KernelLogProbeSpec.model_validate({"name": "x", "type": "kernel_log", "pattern": "x",
                                           "expect": {"matches": 1}})


def test_file_source_counts_lines_appended_after_start(tmp_path: Path):
    log = tmp_path / "kern.log"
    log.write_text("Out of memory: Killed process 1 (old)\n")
    probe = KernelLogProbe(KernelLogProbeSpec.model_validate(
        {"name": "oom", "type": "kernel_log", "pattern": r"Out of memory: Killed process \d+", "source": str(log)}))
    probe.preflight()
    with log.open("a") as f:
        f.write("Out of memory: Killed process 42 (python3)\nsomething else\nOut of memory: Killed pro")
    first = asyncio.run(probe.measure())
    assert first == {"count": 1, "total": 1, "last_match": "Out of memory: Killed process 42 (python3)",
                     "xid": None, "lines": 2, "lost": 0}
    with log.open("a") as f:
        f.write("cess 43 (vllm)\n")
    second = asyncio.run(probe.measure())
    assert (second["count"], second["total"], second["lines"]) == (1, 2, 1)
    assert second["last_match"] == "Out of memory: Killed process 43 (vllm)"
    assert asyncio.run(probe.measure())["count"] == 0
    asyncio.run(probe.close())


def test_unreadable_source_is_a_preflight_error(tmp_path: Path):
    probe = KernelLogProbe(KernelLogProbeSpec.model_validate(
        {"name": "x", "type": "kernel_log", "pattern": "x", "source": str(tmp_path / "missing")}))
    with pytest.raises(PreflightError, match=r"^kernel_log: cannot read .*missing: No such file"):
        probe.preflight()


def test_overwritten_records_count_as_lost(monkeypatch: pytest.MonkeyPatch):
    """The read loop's logic on a scripted sequence (a real ring-buffer wrap would flood the host's log)."""
    from chaoskit.probes import kernel_log

    script: list[bytes | type[OSError]] = [b"6,10,1,-;a\n", BrokenPipeError, b"6,15,2,-;b\n", b"6,16,3,-;c\n",
                                           BlockingIOError]

    def fake_read(fd: int, n: int) -> bytes:
        item = script.pop(0)
        if isinstance(item, type):
            raise item()
        return item

    monkeypatch.setattr(kernel_log.os, "read", fake_read)
    tail = kernel_log.KmsgTail(fd=99)
    assert tail.read() == [(10, "a"), (15, "b"), (16, "c")]
    assert tail.lost == 4
