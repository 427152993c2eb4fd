"""eBPF probes with real events: connects in a test namespace, an OOM kill in a memory-limited cgroup, O_DIRECT
reads on a loop device, retransmits under an nftables drop, run-queue waits of one process."""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from chaoskit.injectors.firewall.fault import Drop
from chaoskit.probes.ebpf import EbpfProbe, EbpfProbeSpec, hist_values
from chaoskit.probes.kernel_btf import VMLINUX, KernelBtf
from chaoskit.targets.netns import run_in_netns
from tests.conftest import ROOT, bcc_missing, chaoskit, write
from tests.helpers.netpair import SERVER_IP, Pair, Server, snmp, upload_rate

HELPERS = Path(__file__).resolve().parent.parent / "helpers"


REASON = bcc_missing("runqueue_latency")
pytestmark = pytest.mark.skipif(REASON is not None, reason=f"eBPF unavailable: {REASON}")


def probe(program: str, **filters) -> EbpfProbe:
    p = EbpfProbe(EbpfProbeSpec(type="ebpf", name=program, program=program, **filters))
    p.preflight()
    return p


def measure(p: EbpfProbe) -> dict:
    return asyncio.run(p.measure())


@pytest.fixture
def pair():
    p = Pair()
    yield p
    p.close()


def test_hist_percentiles_from_log_linear_buckets():
    assert hist_values({}) == {"count": 0}
    v = hist_values({3: 50, 8 * 10 + 4: 49, 8 * 20: 1})  # 3 us, 1536..1664 us, ~1 s
    assert v["count"] == 100 and v["p50_us"] == 3 and 1536 <= v["p90_us"] <= 1664 and v["max_us"] > 1e6


def test_connect_latency_in_a_test_namespace(pair):
    """Connects made in the namespace count, to its peer and on its own loopback; those of another namespace with
    the same addresses (another pair) and the host's loopback connects do not (every namespace has 127.0.0.1: a
    filter by source address counted the host's, 33 of 30 with host connects running beside it)."""
    server, twin = Server(pair.path(pair.srv)), Pair()
    twin_server = Server(twin.path(twin.srv))
    p = probe("tcp_connect_latency", netns=pair.cli)

    def connects(host: str, port: int, n: int) -> None:
        for _ in range(n):
            socket.create_connection((host, port), timeout=5).close()

    def on_own_loopback() -> None:
        with socket.create_server(("127.0.0.1", 0)) as local:
            connects("127.0.0.1", local.getsockname()[1], 5)

    try:
        measure(p)  # start a fresh window
        run_in_netns(pair.path(pair.cli), lambda: connects(SERVER_IP, server.port, 30))
        run_in_netns(pair.path(pair.cli), on_own_loopback)
        run_in_netns(twin.path(twin.cli), lambda: connects(SERVER_IP, twin_server.port, 10))
        on_own_loopback()  # in the host's namespace
        v = measure(p)
        print(f"\nconnect latency in {pair.cli}: {v}")
        assert v["count"] == 35 and 0 < v["p50_us"] < 100_000
    finally:
        asyncio.run(p.close())
        server.close()
        twin_server.close()
        twin.close()


def test_connect_latency_filtered_by_destination_port():
    servers = [socket.create_server(("127.0.0.1", 0), backlog=64) for _ in range(2)]
    ports = [srv.getsockname()[1] for srv in servers]
    p = probe("tcp_connect_latency", port=ports[0])
    try:
        measure(p)
        for port, n in zip(ports, (20, 10), strict=True):
            for _ in range(n):
                socket.create_connection(("127.0.0.1", port), timeout=5).close()
        v = measure(p)
        print(f"\nconnect latency to port {ports[0]} only: {v}")
        assert v["count"] == 20
    finally:
        asyncio.run(p.close())
        for srv in servers:
            srv.close()


def test_kernel_btf_gives_member_offsets_and_tracepoint_args():
    if not VMLINUX.exists():
        pytest.skip(f"no {VMLINUX}")
    btf = KernelBtf.load()
    offset, size = btf.member("task_struct", "pid")
    assert size == 4 and offset > 0
    assert btf.member("sock", "__sk_common.skc_dport")[1] == 2  # inside an anonymous struct of a union
    assert btf.tracepoint_args("sched_switch")[1:3] == ["struct task_struct *", "struct task_struct *"]
    with pytest.raises(LookupError):
        btf.member("task_struct", "no_such_member")


def test_connect_latency_when_its_pending_slots_collide():
    """Two pending slots for the whole host's connects while eight are in SYN_SENT at once (their SYNs dropped
    by a full accept queue until it is drained): most go to the fallback hash, and none is lost there (it
    counts what a probe with the usual 4096 slots counts over the same connects)."""
    server = socket.create_server(("127.0.0.1", 0), backlog=8)
    first = [socket.create_connection(server.getsockname()) for _ in range(9)]  # a full queue drops later SYNs
    tight = EbpfProbe(EbpfProbeSpec(type="ebpf", name="c2", program="tcp_connect_latency", port=server.getsockname()[1]))
    tight.cflags = lambda btf=None: EbpfProbe.cflags(tight, btf) + ["-DPENDING_BITS=1"]  # type: ignore[method-assign]
    probes, waiting = [tight], []
    try:
        tight.preflight()
        probes.append(probe("tcp_connect_latency", port=server.getsockname()[1]))
        for p in probes:
            measure(p)
        for _ in range(8):
            c = socket.socket()
            c.setblocking(False)
            c.connect_ex(server.getsockname())
            waiting.append(c)
        time.sleep(0.2)
        in_hash = tight.bpf[b"pending_more_size"][0].value
        server.settimeout(0.2)
        deadline = time.monotonic() + 20
        accepted = 0
        while accepted < 17 and time.monotonic() < deadline:  # the retransmitted SYNs find room once drained
            try:
                server.accept()[0].close()
                accepted += 1
            except TimeoutError:
                pass
        few, usual = (measure(p) for p in probes)
        print(f"\ntcp_connect_latency with 2 pending slots: {few['count']} (in the fallback hash while pending: "
              f"{in_hash}), with 4096: {usual['count']}; p50 {few['p50_us']} vs {usual['p50_us']} us")
        assert accepted == 17 and in_hash >= 6
        assert few["count"] == usual["count"] == 8 and few["p50_us"] == usual["p50_us"] > 500_000  # a retransmit
    finally:
        for p in probes:
            asyncio.run(p.close())
        for c in (*first, *waiting):
            c.close()
        server.close()


def test_oom_kill_in_a_memory_limited_cgroup():
    root = Path("/sys/fs/cgroup/memory")
    if not (root / "memory.limit_in_bytes").exists():
        pytest.skip("no cgroup v1 memory controller at /sys/fs/cgroup/memory")
    cg = root / f"chaoskit-oomtest-{uuid.uuid4().hex[:8]}"
    cg.mkdir()
    p = probe("oom_kills")
    hog = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.readline(); b = bytearray(512 << 20); "
                            "[b.__setitem__(i, 1) for i in range(0, len(b), 4096)]"], stdin=subprocess.PIPE, text=True)
    try:
        (cg / "memory.limit_in_bytes").write_text(str(32 << 20))
        if (cg / "memory.memsw.limit_in_bytes").exists():
            (cg / "memory.memsw.limit_in_bytes").write_text(str(32 << 20))
        (cg / "cgroup.procs").write_text(str(hog.pid))
        assert hog.stdin
        hog.stdin.write("go\n")
        hog.stdin.flush()
        assert hog.wait(timeout=30) == -9
        v = measure(p)
        print(f"\noom_kills: {v}")
        assert v["count"] >= 1 and v["last_victim_pid"] == hog.pid and "python" in v["victims"]
    finally:
        asyncio.run(p.close())
        if hog.poll() is None:
            hog.kill()
            hog.wait()
        for _ in range(150):  # a memcg whose task was just OOM-killed can stay busy for a moment
            try:
                cg.rmdir()
                break
            except OSError:
                try:
                    (cg / "memory.force_empty").write_text("0")
                except OSError:
                    pass
                time.sleep(0.1)
        assert not cg.exists(), f"could not remove {cg}"


def test_block_io_latency_on_a_loop_device(loopdev):
    p = probe("block_io_latency", device=loopdev)
    reader = subprocess.Popen([sys.executable, str(HELPERS / "direct_reader.py"), loopdev], stdout=subprocess.DEVNULL)
    try:
        measure(p)
        time.sleep(1.0)
        v = measure(p)
        print(f"\nblock_io_latency {loopdev}: {v}")
        assert v["count"] > 100 and v["p50_us"] > 0
    finally:
        reader.kill()
        reader.wait()
        asyncio.run(p.close())


def test_block_io_latency_times_each_request_diskstats_counts(loopdev):
    """One wait per request /sys/block/DEV/stat counts, from the block layer's stamp to the device's completion:
    diskstats adds a few microseconds more per request (it also counts the completion's own work), never less."""
    stat = Path(f"/sys/block/{Path(loopdev).name}/stat")

    def ios_and_ms() -> tuple[int, int]:
        f = [int(x) for x in stat.read_text().split()]
        return f[0] + f[4], f[3] + f[7]  # reads + writes completed, ms spent reading + writing

    p = probe("block_io_latency", device=loopdev)
    reader = None
    try:
        measure(p)  # both windows span the whole reader: nothing else reads the test's loop device
        ios0, ms0 = ios_and_ms()
        reader = subprocess.Popen([sys.executable, str(HELPERS / "direct_reader.py"), loopdev],
                                  stdout=subprocess.DEVNULL)
        time.sleep(1.0)
        reader.kill()
        reader.wait()
        time.sleep(0.1)  # its last read completes
        ios1, ms1 = ios_and_ms()
        v = measure(p)
        more_us = ((ms1 - ms0) * 1000 - v["count"] * v["mean_us"]) / max(v["count"], 1)
        print(f"\nblock_io_latency {loopdev}: {v}; diskstats: {ios1 - ios0} I/Os, {ms1 - ms0} ms: {more_us:.1f} us "
              "more per I/O")
        assert v["count"] > 1000 and abs(v["count"] - (ios1 - ios0)) <= 2  # the read in flight at the kill
        assert -2 <= more_us <= 50  # -2: diskstats' ms truncated, bucket midpoints; 50: a loaded host
    finally:
        if reader is not None:
            reader.kill()
            reader.wait()
        asyncio.run(p.close())


def test_block_io_latency_filtered_by_cgroup(loopdev):
    root = next((r for r in (Path("/sys/fs/cgroup"), Path("/sys/fs/cgroup/unified"))
                 if (r / "cgroup.controllers").exists()), None)
    if root is None:
        pytest.skip("no cgroup v2 hierarchy mounted")
    mine, other = (root / f"chaoskit-ebpftest-{uuid.uuid4().hex[:8]}-{n}" for n in ("a", "b"))
    mine.mkdir()
    other.mkdir()
    reader = subprocess.Popen([sys.executable, str(HELPERS / "direct_reader.py"), loopdev], stdout=subprocess.DEVNULL)
    probes = []
    try:
        (mine / "cgroup.procs").write_text(str(reader.pid))
        probes = [probe("block_io_latency", device=loopdev, cgroup=str(cg)) for cg in (mine, other)]
        for p in probes:
            measure(p)
        time.sleep(1.0)
        seen, unseen = (measure(p) for p in probes)
        print(f"\nblock_io_latency by cgroup: reader's cgroup {seen['count']}, another cgroup {unseen['count']}")
        assert seen["count"] > 100 and unseen["count"] == 0
    finally:
        reader.kill()
        reader.wait()
        for p in probes:
            asyncio.run(p.close())
        for cg in (mine, other):
            for _ in range(50):
                try:
                    cg.rmdir()
                    break
                except OSError:
                    time.sleep(0.1)


def retransmitted(ns: str) -> int:
    """The namespace's own count of retransmitted TCP segments (RetransSegs in its /proc/net/snmp)."""
    return snmp(ns, "Tcp")["RetransSegs"]


def test_retransmits_under_an_nftables_drop(pair):
    """The probe counts the retransmits the namespace's own counter counts (one event per packet, which may carry
    several segments). An upload may get through the 30% drop with few or none (40 uploads of 300 kB here: 1 to
    209 segments; the probe counted 0 once in a clean-clone run): while the counter has not moved, it is made
    again."""
    server = Server(pair.path(pair.srv), 7005, sink=True)
    drop = Drop(Drop.Spec(type="network.drop", target={"netns": pair.srv}, percent="30%", direction="input"))
    drop.preflight()
    rec = drop.apply(drop.prepare())
    p = probe("tcp_retransmits", netns=pair.cli)
    try:
        measure(p)
        cli = pair.path(pair.cli)
        before = retransmitted(cli)
        for _ in range(5):
            upload_rate(cli, 7005, 300_000)
            if retransmitted(cli) > before:
                break
        segments = retransmitted(cli) - before
        v = measure(p)
        print(f"\ntcp_retransmits from {pair.cli} with 30% input drop at the server: {v}; RetransSegs +{segments}")
        assert 0 < v["count"] <= segments and v["top_destination"] == f"{SERVER_IP}:7005", (v, segments)
    finally:
        Drop.revert(rec)
        asyncio.run(p.close())
        server.close()


def test_runqueue_latency_of_one_process():
    sleeper = subprocess.Popen([sys.executable, "-c", "import time\nwhile True: time.sleep(0.002)"])
    try:
        time.sleep(0.3)
        p = probe("runqueue_latency", pid=sleeper.pid)
        measure(p)
        time.sleep(1.0)
        v = measure(p)
        print(f"\nrunqueue_latency of a process waking every 2 ms: {v}")
        assert 200 < v["count"] < 600  # one wait per wakeup (onto an idle CPU: ~0 us in the scheduler's clock)
        asyncio.run(p.close())
    finally:
        sleeper.kill()
        sleeper.wait()


def test_runqueue_latency_adds_up_to_the_kernels_own_run_delay():
    """Two busy loops on one CPU wait about half the time each: the histogram of one's waits (count x mean)
    is what /proc/PID/schedstat's run_delay grew by over the same window, within the buckets' resolution."""
    spin = [sys.executable, "-c", "while True: pass"]
    busy = [subprocess.Popen(["taskset", "-c", "0", *spin]) for _ in range(2)]
    try:
        time.sleep(0.3)
        p = probe("runqueue_latency", pid=busy[0].pid)
        measure(p)
        before = int(Path(f"/proc/{busy[0].pid}/schedstat").read_text().split()[1])
        time.sleep(2.0)
        v = measure(p)
        grew_ms = (int(Path(f"/proc/{busy[0].pid}/schedstat").read_text().split()[1]) - before) / 1e6
        waited_ms = v["count"] * v["mean_us"] / 1000
        print(f"\nrunqueue_latency of a busy loop sharing a CPU: {v}; waits {waited_ms:.0f} ms, run_delay grew "
              f"{grew_ms:.0f} ms")
        assert grew_ms > 500 and abs(waited_ms - grew_ms) < 0.1 * grew_ms
        asyncio.run(p.close())
    finally:
        for b in busy:
            b.kill()
            b.wait()


def test_filters_that_do_not_apply_are_spec_errors():
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match="device does not filter tcp_retransmits"):
        EbpfProbeSpec(type="ebpf", name="x", program="tcp_retransmits", device="/dev/loop0")


EXPERIMENT = """\
apiVersion: chaoskit/v1
kind: Experiment
metadata: {name: ebpf-broken}
steadyState:
  probes: [{name: rq, type: ebpf, program: runqueue_latency, expect: {p99_us: "< 100000"}}]
method:
  - pause: 1s
"""


def test_a_program_that_does_not_compile_is_a_preflight_error(tmp_path, state_dir):
    broken = tmp_path / "bpf"
    broken.mkdir()
    (broken / "hist.h").write_text((ROOT / "bpf" / "hist.h").read_text())
    (broken / "runqueue_latency.c").write_text("this is not C;\n")
    exp = write(tmp_path / "e.yaml", EXPERIMENT)
    env_dir = os.environ.get("CHAOSKIT_BPF_DIR")
    os.environ["CHAOSKIT_BPF_DIR"] = str(broken)
    try:
        run = chaoskit("run", str(exp), "--out", str(tmp_path / "o"), state=state_dir)
        out, err = run.communicate(timeout=60)
    finally:
        os.environ.pop("CHAOSKIT_BPF_DIR")
        if env_dir:
            os.environ["CHAOSKIT_BPF_DIR"] = env_dir
    assert run.returncode == 4, out + err
    assert "does not compile" in out + err and "Traceback" not in out + err
