"""Typed revert records: what apply wrote reads back into the family's Record model, and a record that does not
(torn, foreign, hand-edited) is refused before anything is undone, naming each wrong field.

The refused records never name the host's own objects (its /etc/passwd, PID 1, its network namespace, its nft
tables, its cgroups, a real cluster, a token as broad as `python`): each names a stand-in this test made under its
tmp_path (or a path that cannot exist), so a validator that lets one through makes revert act on the stand-in, and
the test fails, without harm to the host."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from chaoskit.executors.local import LocalExecutor
from chaoskit.injectors import INJECTORS
from chaoskit.injectors.base import RecordError, RevertRecord
from chaoskit.injectors.cpu.fault import CpuStress, CpuThrottle
from chaoskit.injectors.disk.fill import DiskFill
from chaoskit.injectors.disk.throttle import DiskThrottle
from chaoskit.injectors.exec.fault import TOKEN_VAR, Exec
from chaoskit.injectors.firewall.fault import Drop, Partition
from chaoskit.injectors.flood.fault import Flood
from chaoskit.injectors.gpu.memory_pressure import GpuMemoryPressure
from chaoskit.injectors.gpu.mig import MigReconfigure
from chaoskit.injectors.gpu.xid import XidEvent
from chaoskit.injectors.helper_proc import TOKEN
from chaoskit.injectors.kube.fault import DeploymentScale, PodDelete, PodKill
from chaoskit.injectors.kv_notify.fault import KvNotify
from chaoskit.injectors.llm_proxy.fault import LlmProxy
from chaoskit.injectors.memory.limit import MemoryLimit
from chaoskit.injectors.memory.pressure import MemoryPressure
from chaoskit.injectors.netem.fault import Bandwidth, Netem, QdiscRecord
from chaoskit.injectors.netem.nfqueue import QueueRecord
from chaoskit.injectors.process.fault import ProcessSignal, SignalRecord
from chaoskit.injectors.proxy.fault import Proxy, ProxyRecord
from chaoskit.load.spec import LoadSpec
from chaoskit.targets.process import ProcessRef, proc_ref
from tests.conftest import proc_state, wait_for

HOLDER = f"chaoskit-holder-{uuid.uuid4().hex}"  # of chaoskit's shape, and no process carries it
NETEMQ = f"chaoskit-netemq-{uuid.uuid4().hex}"
GPUHOLDER = f"chaoskit-gpuholder-{uuid.uuid4().hex}"
KVNOTIFY = f"chaoskit-kvnotify-{uuid.uuid4().hex}"
SLEEP = "import time; time.sleep(600)"


@dataclass
class Host:
    """Stand-ins for what the records would otherwise name on this host, all the test's own: a file in place of
    /etc/passwd, a cgroup tree under tmp_path, a plain file in place of a network namespace (with its inode, so
    a record naming it reads as "the same namespace"; entering it fails), a namespace path that does not exist, a
    kubeconfig that does not exist, and a process carrying `token` (on its command line and as exec's token in its
    environment) in place of PID 1 and of every process a broad token matches."""

    dir: Path
    proc: subprocess.Popen
    token: str

    def __post_init__(self) -> None:
        self.passwd = self.dir / "passwd"
        self.passwd.write_text("root:x:0:0:root:/root:/bin/sh\n")
        self.stats = self.dir / "x.json"
        self.stats.write_text("{}\n")
        self.helper_stats = self.dir / f"{NETEMQ}.json"
        self.helper_stats.write_text("{}\n")
        self.cgroups = self.dir / "cgroup"
        self.slice = self.cgroups / "system.slice"  # empty, as a cgroup looks to rmdir: a revert would remove it
        self.own_cgroup = self.cgroups / "chaoskit-0123456789ab"
        self.io_cgroup = self.cgroups / "x"
        for d in (self.slice, self.own_cgroup, self.io_cgroup):
            d.mkdir(parents=True)
        (self.io_cgroup / "io.max").write_text("8:0 rbps=1048576 wbps=max riops=max wiops=max\n")
        self.hierarchy = {"version": 2, "root": str(self.cgroups)}
        netns = self.dir / "netns"
        netns.write_text("not a namespace\n")
        self.ns = {"ns": str(netns), "ns_inode": netns.stat().st_ino}
        # the host namespace's inode, at a path that does not exist: the path decides (gone)
        self.gone_ns = {"ns": str(self.dir / "no-such-netns"), "ns_inode": 4026531840}
        self.eth0 = {**self.ns, "ifindex": 2, "ifname": "eth0"}
        self.cluster = {"kubeconfig": str(self.dir / "no-such-kubeconfig")}
        self.pid = self.proc.pid
        self.start_time = proc_ref(self.pid).start_time
        self.before = self._state()

    def queue(self, where: dict[str, Any]) -> dict[str, Any]:
        return {**where, "ifindex": 2, "ifname": "eth0", "mode": "queue", "direction": "egress",
                "table": "chaoskit_nq_0123456789ab", "token": NETEMQ}

    def _state(self) -> dict[str, str]:
        return {str(p.relative_to(self.dir)): "dir" if p.is_dir() else p.read_text() for p in self.dir.rglob("*")}

    def changes(self) -> list[str]:
        """What the verbs did to the stand-ins (nothing, when the records were refused)."""
        now = self._state()
        out = [f"{k}: {self.before.get(k)!r} -> {now.get(k)!r}" for k in sorted(set(self.before) | set(now))
               if self.before.get(k) != now.get(k)]
        return out + ([f"process {self.pid} ended ({self.proc.returncode})"] if self.proc.poll() is not None else [])


@pytest.fixture
def host(tmp_path: Path) -> Iterator[Host]:
    token = f"ckt-sentinel-{uuid.uuid4().hex}"  # not of chaoskit's shape: no record may name it
    proc = subprocess.Popen([sys.executable, "-S", "-c", SLEEP, token], env={**os.environ, TOKEN_VAR: token})
    try:
        wait_for(lambda: proc_ref(proc.pid) is not None and token in Path(f"/proc/{proc.pid}/cmdline").read_text())
        (tmp_path / "host").mkdir()
        yield Host(tmp_path / "host", proc, token)
    finally:
        proc.kill()
        proc.wait()


def test_every_bundled_family_declares_its_record():
    """Every fault family chaoskit ships (as the registry lists them) reads its record back into a model."""
    bundled = [c for c in INJECTORS if c.__module__.startswith("chaoskit.")]
    assert bundled and [c.type for c in bundled if c.Record is None] == []
    assert all(issubclass(c.Record, RevertRecord) for c in bundled)


def test_a_sigstop_record_reads_back_and_is_reverted_from_the_model():
    sleeper = subprocess.Popen(["sleep", "60"])
    try:
        inj = ProcessSignal(ProcessSignal.Spec.model_validate({"type": "process.signal", "pid": sleeper.pid}))
        final = inj.apply(inj.prepare()).to_json()  # as the ledger keeps it
        wait_for(lambda: proc_state(sleeper.pid) == "T")
        record = ProcessSignal.read_record(final)
        assert record == SignalRecord(signal="SIGSTOP", targets=[proc_ref(sleeper.pid)])
        assert isinstance(record.targets[0], ProcessRef) and ProcessSignal.observe(record)
        LocalExecutor().revert("process.signal", final, None)
        assert proc_state(sleeper.pid) in ("S", "R") and not ProcessSignal.observe(record)
    finally:
        sleeper.kill()
        sleeper.wait()


# (family, the record given the stand-ins, what is wrong with it: a string, or one given the stand-ins)
REFUSED = [
    (ProcessSignal, lambda h: {"targets": []}, "(signal: Field required)"),
    (ProcessSignal, lambda h: {"signal": "SIGSTOP", "targets": [{"pid": "x", "start_time": 1}]},
     "(targets.0.pid: Input should be a valid integer, unable to parse string as an integer)"),
    (Proxy, lambda h: {"listen": "127.0.0.1:1", "upstream": "127.0.0.1:2"}, "(token: Field required)"),
    # revert stops every process carrying the token: only a token of chaoskit's shape (this one is the stand-in's)
    (Proxy, lambda h: {"token": h.token, "listen": "127.0.0.1:1", "upstream": "127.0.0.1:2", "proxy": {"pid": h.pid}},
     f"(token: String should match pattern '{TOKEN}'; proxy.start_time: Field required)"),
    # revert removes the status file: only the holder's own
    (MemoryPressure, lambda h: {"token": HOLDER, "status": str(h.passwd), "bytes": 1 << 20},
     lambda h: f"(record: Value error, {h.passwd} is not a file of helper {HOLDER})"),
    (CpuStress, lambda h: {"token": HOLDER, "workers": 1, "load": 1.0, "nice": 0, "worker_procs": [{"pid": h.pid}]},
     "(worker_procs.0.start_time: Field required)"),
    (GpuMemoryPressure, lambda h: {"token": GPUHOLDER, "device": 0, "target": {"kind": "bytes", "value": 1.0},
                                   "status": str(h.passwd)},  # revert removes it: only the holder's own
     lambda h: f"(record: Value error, {h.passwd} is not a file of helper {GPUHOLDER})"),
    (Flood, lambda h: {"token": h.token}, f"(token: String should match pattern '{TOKEN}')"),
    (KvNotify, lambda h: {"token": KVNOTIFY, "listen": "[::]:1", "upstream": "original", "stats": str(h.passwd)},
     lambda h: f"(record: Value error, {h.passwd} is not the stats file of helper {KVNOTIFY})"),  # revert removes it
    (CpuThrottle, lambda h: {"hierarchy": h.hierarchy, "cgroup": str(h.slice), "quota": 1000, "period": 100000},
     lambda h: f"(record: Value error, a dedicated cgroup is a chaoskit-* one, not {h.slice})"),  # revert rmdirs it
    (MemoryLimit, lambda h: {"hierarchy": h.hierarchy, "cgroup": str(h.own_cgroup), "token": h.token},
     f"(token: String should match pattern '{TOKEN}')"),
    (DiskThrottle, lambda h: {"hierarchy": h.hierarchy, "cgroup": str(h.io_cgroup), "dedicated": False, "dev": "8:0",
                              "limits": {"rbps": "1048576"}, "procs": [{"pid": h.pid, "start_time": h.start_time}]},
     "(procs.0.from: Field required)"),
    (Exec, lambda h: {"apply": ["/bin/true"], "revert": [], "timeout": 5, "token": h.token},
     "(revert: List should have at least 1 item after validation, not 0; token: String should match pattern "
     "'^[0-9a-f]{32}$')"),
    (DeploymentScale, lambda h: {"cluster": h.cluster, "namespace": "default", "deployment": "web", "replicas": -1},
     "(previous_replicas: Field required; replicas: Input should be greater than or equal to 0)"),
    (PodDelete, lambda h: {"cluster": h.cluster, "grace_period_s": -1, "pods": [{"pod": "web-0"}]},
     "(grace_period_s: Input should be greater than or equal to 0; pods.0.namespace: Field required; "
     "pods.0.uid: Field required)"),
    (PodKill, lambda h: {"grace_period_s": 0, "pods": []}, "(cluster: Field required)"),
    (XidEvent, lambda h: {"event": True, "pci_bus_id": "PCI:3b", "xid": 0, "level": 4, "written": [{"line": "x"}]},
     "(pci_bus_id: String should match pattern '^[0-9a-f]{4,8}:[0-9a-f]{2}:[0-9a-f]{2}\\.[0-7]$'; xid: Input should "
     "be greater than or equal to 1; written.0.at: Field required)"),
    (XidEvent, lambda h: {"pci_bus_id": "0000:3b:00.0", "xid": 79, "level": 4}, "(event: Field required)"),
    (MigReconfigure, lambda h: {"uuid": "GPU-no-such-gpu", "checkpoint": "MIG 1g.18gb x7"},
     "(checkpoint: Input should be a dictionary or an instance of MigState)"),
    (MigReconfigure, lambda h: {"uuid": "GPU-x", "checkpoint": {"uuid": "GPU-x", "mode_current": True,
                                                                "mode_pending": False, "gpu_instances": [{"id": 1}]}},
     "(checkpoint.gpu_instances.0.profile: Field required; checkpoint.gpu_instances.0.profile_id: Field required; "
     "checkpoint.gpu_instances.0.slices: Field required; checkpoint.gpu_instances.0.placement: Field required)"),
    (Bandwidth, lambda h: {**h.ns, "ifindex": 0, "ifname": "eth0/x", "direction": "ingress", "ifb": "eth0"},
     "(ifindex: Input should be greater than 0; ifname: String should match pattern '^[^/:\\s]{1,15}$'; "
     "ifb: String should match pattern '^ck[0-9a-f]{10}$')"),  # revert deletes the link named so
    (Bandwidth, lambda h: {**h.eth0, "direction": "ingress"},
     "(record: Value error, an ingress record names its IFB device (ifb))"),
    (Bandwidth, lambda h: {**h.eth0, "direction": "egress", "previous": {"handle": 1, "parent": 1, "kind": "tbf",
                                                                        "options": {"type": 2, "hex": "zz"}}},
     "(previous.options.hex: String should match pattern '^(?:[0-9a-f]{2})*$')"),
    (Netem, lambda h: {"ns": h.ns["ns"], "ifindex": 2, "ifname": "eth0", "direction": "both", "mode": "qdisc"},
     "(ns_inode: Field required; direction: Input should be 'egress' or 'ingress')"),
    (Netem, lambda h: {**h.queue(h.ns), "table": "filter", "token": h.token, "stats": str(h.stats)},  # never a
     "(table: String should match pattern '^chaoskit_nq_[0-9a-f]{12}$'; token: String should match pattern "
     "'^chaoskit-netemq-[0-9a-f]{32}$')"),  # table not ours, nor a token not of chaoskit's shape
    # a namespace that is gone: revert goes straight to the helper and its stats file
    (Netem, lambda h: {**h.queue(h.gone_ns), "stats": str(h.helper_stats), "helper": {"pid": h.pid}},
     "(helper.start_time: Field required)"),
    (Netem, lambda h: {**h.queue(h.gone_ns), "stats": str(h.passwd)},  # revert deletes it: only the helper's own
     lambda h: f"(record: Value error, {h.passwd} is not the stats file of helper {NETEMQ})"),
    (DiskFill, lambda h: {"file": str(h.passwd), "bytes": 0},  # revert deletes it: only a fill file of chaoskit's
     "(file: String should match pattern '/\\.chaoskit-fill-[0-9a-f]{12}$')"),
    (Drop, lambda h: {**h.ns, "table": "filter"},  # never a table not chaoskit's
     "(table: String should match pattern '^chaoskit_[0-9a-f]{12}$')"),
    (Partition, lambda h: {"ns": h.ns["ns"], "table": "chaoskit_0123456789ab"}, "(ns_inode: Field required)"),
]
APART_FROM_HOST = {"/bin/true"}  # a program an apply would run; no verb here runs it


def _strings(value: Any) -> Iterator[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for v in value.values():
            yield from _strings(v)
    elif isinstance(value, list):
        for v in value:
            yield from _strings(v)


@pytest.mark.parametrize(("cls", "make", "wrong"), REFUSED,
                         ids=[f"{c.type}-{i}" for i, (c, _, _) in enumerate(REFUSED)])
def test_a_record_that_does_not_read_back_is_refused_before_any_undo(host, cls, make, wrong):
    record = make(host)
    named = [s for s in _strings(record) if s.startswith("/") and s not in APART_FROM_HOST]
    assert all(Path(s).is_relative_to(host.dir) for s in named), f"the record names a path of the host's: {named}"
    wrong = wrong(host) if callable(wrong) else wrong
    try:
        for verb in (cls.revert, cls.observe):  # through the seam every caller uses (the executors, the agent)
            with pytest.raises(RecordError) as e:
                verb(cls.from_ledger(record))
            assert str(e.value) == f"{cls.type}: its revert record does not read back {wrong}"
    finally:  # what a verb that let the record through did, shown even where it failed on it
        assert host.changes() == [], f"{cls.type} acted on a record it should have refused"


def test_unknown_keys_are_left_alone_and_a_prepared_record_is_enough():
    token = f"chaoskit-proxy-{uuid.uuid4().hex}"
    prepared = {"token": token, "listen": "127.0.0.1:1", "upstream": "127.0.0.1:2", "later": 1}
    assert Proxy.read_record(prepared) == ProxyRecord(token=token, listen="127.0.0.1:1", upstream="127.0.0.1:2")
    Proxy.revert(Proxy.from_ledger(prepared))  # killed before the helper started: nothing to stop, and no error
    assert not Proxy.observe(Proxy.from_ledger(prepared))


def test_network_records_written_the_old_way_read_back(host):
    """network.bandwidth / network.netem records as the ledger has always kept them (no mode before queue mode
    came; the snapshot of the previous qdisc with its ifindex) read back, and a foreign namespace is left alone."""
    tbf = {"ifindex": 2, "handle": 0x50000, "parent": 0xFFFFFFFF, "kind": "tbf",
           "options": {"type": 2, "hex": "0123abcd"}}
    egress = {**host.eth0, "direction": "egress", "previous": tbf}
    ingress = {**host.eth0, "direction": "ingress", "ifb": "ck0123456789", "had_ingress": False}
    for cls in (Bandwidth, Netem):
        r = cls.read_record(egress)
        assert isinstance(r, QdiscRecord) and r.mode == "qdisc" and r.previous is not None
        assert {k: v for k, v in tbf.items() if k != "ifindex"} == {k: v for k, v in r.previous.to_json().items()
                                                                   if k != "ifindex"}
        assert cls.read_record({**host.eth0, "direction": "egress", "previous": None}).previous is None
        assert cls.read_record(ingress).ifb == "ck0123456789"
    assert Netem.read_record({**egress, "mode": "qdisc", "mode_reason": "auto: this kernel has sch_netem"}).mode_reason
    queue = {**host.queue(host.ns), "mode_reason": "mode: queue asked", "stats": str(host.helper_stats),
             "helper": {"pid": 12345, "start_time": 678, "comm": "netemq"}, "queue": 20001}
    r = Netem.read_record(queue)
    assert isinstance(r, QueueRecord) and r.helper == ProcessRef(12345, 678, "netemq") and r.queue == 20001
    assert Netem.read_record({**host.queue(host.ns), "stats": str(host.helper_stats)}).helper is None  # as prepared
    other_ns = {**host.ns, "ns_inode": host.ns["ns_inode"] + 1}  # the path names another namespace now: untouched
    for record in ({**egress, **other_ns}, {**queue, **other_ns, "helper": None}):
        assert not Netem.observe(Netem.from_ledger(record))
    Bandwidth.revert(Bandwidth.from_ledger({**egress, **other_ns}))
    assert host.changes() == []


def test_cgroup_records_written_the_old_way_keep_every_key(host):
    """process.cpu_throttle / process.memory_limit / disk.throttle records as the ledger has always kept them
    (plain dicts, before their verbs took the Record) read back without losing a key: the moved processes' comm,
    the enables_* flag that says revert turns the controller off again, what apply added (holder, limit_bytes)."""
    moved = {"pid": host.pid, "start_time": host.start_time, "comm": "python3", "from": str(host.slice),
             "threads": [{"tid": host.pid, "from": str(host.slice)}]}
    base = {"hierarchy": host.hierarchy, "cgroup": str(host.own_cgroup), "procs": [moved]}
    records = {
        CpuThrottle: {**base, "quota": 20000, "period": 100000, "enables_cpu": True},
        MemoryLimit: {**base, "limit": None, "headroom": 1 << 26, "pressure": 1 << 23, "token": HOLDER,
                      "enables_memory": True, "usage_at_move": 1 << 20, "limit_bytes": (1 << 26) + (1 << 20),
                      "charges_moved": False, "holder": {"pid": host.pid, "start_time": host.start_time,
                                                         "comm": "python3"}, "holder_oom_score_adj": -1000},
        DiskThrottle: {**base, "dedicated": True, "dev": "8:0", "limits": {"rbps": "1048576"}, "enables_io": True,
                       "procs": [{k: v for k, v in moved.items() if k != "threads"}]},  # disk.throttle writes none
    }
    for cls, record in records.items():
        back = cls.to_ledger(cls.from_ledger(record))
        as_written = {**record, "procs": [{"threads": [], **p} for p in record["procs"]]}  # none: an empty list
        assert {k: back[k] for k in record} == as_written, cls.type
    r = CpuThrottle.from_ledger(records[CpuThrottle])
    assert r.enables_cpu and r.procs[0].ref() == ProcessRef(host.pid, host.start_time, "python3")
    assert MemoryLimit.from_ledger(records[MemoryLimit]).holder == ProcessRef(host.pid, host.start_time, "python3")
    assert host.changes() == []


def _gone(comm: str) -> dict[str, Any]:
    """A recorded helper that is no longer that process: this test's own PID with a start time it never had."""
    return {"pid": os.getpid(), "start_time": 1, "comm": comm}


def _helper_records(tmp: Path) -> list[tuple[Any, dict[str, Any]]]:
    """Records of the helper-process families, key for key as apply wrote them into the ledger before their
    verbs took typed records (their files under `tmp`, their processes gone)."""
    hx = uuid.uuid4().hex
    mem, gpu = f"chaoskit-holder-{hx}", f"chaoskit-gpuholder-{hx}"
    proxy = {"token": f"chaoskit-proxy-{hx}", "listen": "127.0.0.1:1", "upstream": "127.0.0.1:2", "listen_tls": False,
             "proxy": _gone("python")}
    intercept = {"listen": "[::]:40001", "upstream": "original", "ns": str(tmp / "ns"), "ns_inode": 1,
                 "table": "chaoskit_0123456789ab", "reset_connections": 2}
    kv = f"chaoskit-kvnotify-{hx}"
    load = json.loads(LoadSpec(url="http://127.0.0.1:1/", api="http", rate=50, duration=60).model_dump_json())
    return [
        (CpuStress, {"token": f"chaoskit-holder-cpustress-{hx}", "workers": 2, "load": 0.3, "nice": 10,
                     "holder": _gone("python"), "worker_procs": [_gone("python"), _gone("python")]}),
        (MemoryPressure, {"token": mem, "status": str(tmp / f"{mem}.status.json"), "bytes": 64 << 20,
                          "holder": _gone("python")}),
        (MemoryPressure, {"token": mem, "status": str(tmp / f"{mem}.status.json"), "bytes": 8 << 30,
                          "goal_available": 4 << 30, "floor": 1 << 30, "deadband": 40 << 20, "holder": _gone("python")}),
        (GpuMemoryPressure, {"token": gpu, "device": 0, "target": {"kind": "bytes", "value": float(1 << 30),
                                                                   "hold": "fixed", "ramp_s": 0.0},
                             "fragment": None, "status": str(tmp / f"{gpu}.status.json"),
                             "journal": str(tmp / f"{gpu}.corrections.jsonl"), "holder": _gone("python")}),
        (GpuMemoryPressure, {"token": gpu, "device": "GPU-11111111-2222-3333-4444-555555555555",
                             "target": {"kind": "leave_free", "value": 0.0, "hold": "fixed", "ramp_s": 0.0},
                             "fragment": {"holes": 4, "hole_size": 256 << 20}, "status": str(tmp / f"{gpu}.status.json"),
                             "journal": str(tmp / f"{gpu}.corrections.jsonl")}),
        (Flood, {"token": f"chaoskit-flood-{hx}", "helper": _gone("python"), "load": load}),
        (Proxy, proxy),
        (Proxy, {**proxy, **intercept}),
        (LlmProxy, {**proxy, "token": f"chaoskit-llm-proxy-{hx}", "listen_tls": True}),
        (KvNotify, {**proxy, **intercept, "token": kv, "stats": str(tmp / f"{kv}.json")}),
    ]


def test_helper_records_the_ledger_already_holds_read_back_whole_and_revert(tmp_path):
    """A helper-process family's record written before its verbs took typed records reads back with every key
    and value it had (the ledger form written again is a superset), and its revert and observe work from it."""
    for cls, old in _helper_records(tmp_path):
        for name in ("status", "journal", "stats"):
            if name in old:
                Path(old[name]).write_text("{}")
        record = cls.from_ledger(old)
        assert isinstance(record, cls.Record)
        again = cls.to_ledger(record)
        assert {k: again[k] for k in old} == old, cls.type
        assert cls.from_ledger(json.loads(json.dumps(again))) == record
        cls.revert(record)  # nothing of it runs (its namespace is no namespace): nothing to stop, and no error
        assert not cls.observe(record)
    assert list(tmp_path.iterdir()) == []  # each helper's own files removed by its revert
