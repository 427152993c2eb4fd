"""Typed revert records: what apply wrote reads back into the family's Record model, and a record that does not
(torn, foreign, hand-edited) is refused before anything is undone, naming each wrong field."""

from __future__ import annotations

import subprocess

import pytest

from chaoskit.executors.local import LocalExecutor
from chaoskit.injectors import INJECTORS
from chaoskit.injectors.base import RecordError
from chaoskit.injectors.cpu import CpuStress, CpuThrottle
from chaoskit.injectors.disk import DiskThrottle
from chaoskit.injectors.diskfill import DiskFill
from chaoskit.injectors.exec import Exec
from chaoskit.injectors.firewall import Drop, Partition
from chaoskit.injectors.helper_proc import TOKEN
from chaoskit.injectors.kube import DeploymentScale, PodDelete, PodKill
from chaoskit.injectors.memlimit import MemoryLimit
from chaoskit.injectors.memory import MemoryPressure
from chaoskit.injectors.mig import MigReconfigure
from chaoskit.injectors.netem_queue import QueueRecord
from chaoskit.injectors.network import Bandwidth, Netem, QdiscRecord
from chaoskit.injectors.process import ProcessSignal, SignalRecord
from chaoskit.injectors.proxy import Proxy, ProxyRecord
from chaoskit.injectors.xid import XidEvent
from chaoskit.targets.process import ProcessRef, proc_ref
from tests.conftest import proc_state, wait_for

HOLDER = "chaoskit-holder-0123456789abcdef0123456789abcdef"
NETEMQ = "chaoskit-netemq-0123456789abcdef0123456789abcdef"
NS = {"ns": "/proc/1/ns/net", "ns_inode": 4026531840}
ETH0 = {**NS, "ifindex": 2, "ifname": "eth0"}
QUEUE = {**ETH0, "mode": "queue", "direction": "egress", "table": "chaoskit_nq_0123456789ab", "token": NETEMQ}


def test_the_typed_families():
    assert {c.type for c in INJECTORS if c.Record is not None} == {
        "process.signal", "network.proxy", "llm.proxy", "network.drop", "network.partition", "host.cpu_stress",
        "load.flood", "host.memory_pressure", "gpu.memory_pressure", "disk.fill", "process.cpu_throttle",
        "process.memory_limit", "disk.throttle", "exec", "deployment.scale", "gpu.mig", "pod.delete", "pod.kill",
        "gpu.xid", "network.netem", "network.bandwidth", "gpu.cuda_fault", "kv.notify"}


def test_a_sigstop_record_reads_back_and_is_reverted_from_the_model():
    sleeper = subprocess.Popen(["sleep", "60"])
    try:
        inj = ProcessSignal(ProcessSignal.Spec.model_validate({"type": "process.signal", "pid": sleeper.pid}))
        final = inj.apply(inj.prepare())
        wait_for(lambda: proc_state(sleeper.pid) == "T")
        record = ProcessSignal.read_record(final)
        assert record == SignalRecord(signal="SIGSTOP", targets=[proc_ref(sleeper.pid)])
        assert isinstance(record.targets[0], ProcessRef) and ProcessSignal.observe(final)
        LocalExecutor().revert("process.signal", final, None)
        assert proc_state(sleeper.pid) in ("S", "R") and not ProcessSignal.observe(final)
    finally:
        sleeper.kill()
        sleeper.wait()


@pytest.mark.parametrize(("cls", "record", "wrong"), [
    (ProcessSignal, {"targets": []}, "(signal: Field required)"),
    (ProcessSignal, {"signal": "SIGSTOP", "targets": [{"pid": "x", "start_time": 1}]},
     "(targets.0.pid: Input should be a valid integer, unable to parse string as an integer)"),
    (Proxy, {"listen": "127.0.0.1:1", "upstream": "127.0.0.1:2"}, "(token: Field required)"),
    (Proxy, {"token": "python", "listen": "127.0.0.1:1", "upstream": "127.0.0.1:2", "proxy": {"pid": 1}},
     f"(token: String should match pattern '{TOKEN}'; proxy.start_time: Field required)"),
    (MemoryPressure, {"token": HOLDER, "status": "/etc/passwd"},  # revert removes it: only the holder's own file
     f"(record: Value error, /etc/passwd is not a file of helper {HOLDER})"),
    (CpuStress, {"token": HOLDER, "worker_procs": [{"pid": 1}]}, "(worker_procs.0.start_time: Field required)"),
    (CpuThrottle, {"hierarchy": {}, "cgroup": "/sys/fs/cgroup/system.slice", "quota": 1000, "period": 100000},
     "(record: Value error, a dedicated cgroup is a chaoskit-* one, not /sys/fs/cgroup/system.slice)"),
    (MemoryLimit, {"hierarchy": {}, "cgroup": "/sys/fs/cgroup/chaoskit-0123456789ab", "token": "python"},
     f"(token: String should match pattern '{TOKEN}')"),
    (DiskThrottle, {"hierarchy": {}, "cgroup": "/sys/fs/cgroup/x", "dedicated": False, "dev": "8:0",
                    "limits": {"rbps": "1048576"}, "procs": [{"pid": 1, "start_time": 2}]},
     "(procs.0.from: Field required)"),
    (Exec, {"apply": ["/bin/true"], "revert": [], "timeout": 5, "token": "x"},
     "(revert: List should have at least 1 item after validation, not 0; token: String should match pattern "
     "'^[0-9a-f]{32}$')"),
    (DeploymentScale, {"cluster": {}, "namespace": "default", "deployment": "web", "replicas": -1},
     "(previous_replicas: Field required; replicas: Input should be greater than or equal to 0)"),
    (PodDelete, {"cluster": {}, "grace_period_s": -1, "pods": [{"pod": "web-0"}]},
     "(grace_period_s: Input should be greater than or equal to 0; pods.0.namespace: Field required; "
     "pods.0.uid: Field required)"),
    (PodKill, {"grace_period_s": 0, "pods": []}, "(cluster: Field required)"),
    (XidEvent, {"event": True, "pci_bus_id": "PCI:3b", "xid": 0, "level": 4, "written": [{"line": "x"}]},
     "(pci_bus_id: String should match pattern '^[0-9a-f]{4,8}:[0-9a-f]{2}:[0-9a-f]{2}\\.[0-7]$'; xid: Input should "
     "be greater than or equal to 1; written.0.at: Field required)"),
    (XidEvent, {"pci_bus_id": "0000:3b:00.0", "xid": 79, "level": 4}, "(event: Field required)"),
    (MigReconfigure, {"device": 0, "checkpoint": "MIG 1g.18gb x7"}, "(checkpoint: Input should be a valid dictionary)"),
    (Bandwidth, {**NS, "ifindex": 0, "ifname": "eth0/x", "direction": "ingress", "ifb": "eth0"},  # revert deletes it
     "(ifindex: Input should be greater than 0; ifname: String should match pattern '^[^/:\\s]{1,15}$'; "
     "ifb: String should match pattern '^ck[0-9a-f]{10}$')"),
    (Bandwidth, {**ETH0, "direction": "ingress"}, "(record: Value error, an ingress record names its IFB device (ifb))"),
    (Bandwidth, {**ETH0, "direction": "egress", "previous": {"handle": 1, "parent": 1, "kind": "tbf",
                                                            "options": {"type": 2, "hex": "zz"}}},
     "(previous.options.hex: String should match pattern '^(?:[0-9a-f]{2})*$')"),
    (Netem, {"ns": "/proc/1/ns/net", "ifindex": 2, "ifname": "eth0", "direction": "both", "mode": "qdisc"},
     "(ns_inode: Field required; direction: Input should be 'egress' or 'ingress')"),
    (Netem, {**QUEUE, "table": "filter", "token": "python", "stats": "/tmp/x.json"},  # never a table not ours
     "(table: String should match pattern '^chaoskit_nq_[0-9a-f]{12}$'; token: String should match pattern "
     "'^chaoskit-netemq-[0-9a-f]{32}$')"),
    (Netem, {**QUEUE, "stats": f"/tmp/{NETEMQ}.json", "helper": {"pid": 1}}, "(helper.start_time: Field required)"),
    (Netem, {**QUEUE, "stats": "/etc/passwd"},  # revert deletes it: only the helper's own stats file
     f"(record: Value error, /etc/passwd is not the stats file of helper {NETEMQ})"),
    (DiskFill, {"file": "/etc/passwd", "bytes": 0},  # revert deletes it: only a fill file of chaoskit's
     "(file: String should match pattern '/\\.chaoskit-fill-[0-9a-f]{12}$')"),
    (Drop, {"ns": "/proc/1/ns/net", "ns_inode": 4026531840, "table": "filter"},  # never a table not chaoskit's
     "(table: String should match pattern '^chaoskit_[0-9a-f]{12}$')"),
    (Partition, {"ns": "/proc/1/ns/net", "table": "chaoskit_0123456789ab"}, "(ns_inode: Field required)"),
])
def test_a_record_that_does_not_read_back_is_refused_before_any_undo(cls, record, wrong):
    for verb in (cls.revert, cls.observe):
        with pytest.raises(RecordError) as e:
            verb(record)
        assert str(e.value) == f"{cls.type}: its revert record does not read back {wrong}"


def test_unknown_keys_are_left_alone_and_a_prepared_record_is_enough():
    token = "chaoskit-proxy-0123456789abcdef0123456789abcdef"
    prepared = {"token": token, "listen": "127.0.0.1:1", "upstream": "127.0.0.1:2", "later": 1}
    assert Proxy.read_record(prepared) == ProxyRecord(token=token, listen="127.0.0.1:1", upstream="127.0.0.1:2")
    Proxy.revert(prepared)  # killed before the helper started: nothing to stop, and no error
    assert not Proxy.observe(prepared)


def test_network_records_written_the_old_way_read_back():
    """network.bandwidth / network.netem records as the ledger has always kept them (no mode before queue mode
    came; the snapshot of the previous qdisc with its ifindex) read back, and a foreign namespace is left alone."""
    tbf = {"ifindex": 2, "handle": 0x50000, "parent": 0xFFFFFFFF, "kind": "tbf",
           "options": {"type": 2, "hex": "0123abcd"}}
    egress = {**ETH0, "direction": "egress", "previous": tbf}
    ingress = {**ETH0, "direction": "ingress", "ifb": "ck0123456789", "had_ingress": False}
    for cls in (Bandwidth, Netem):
        r = cls.read_record(egress)
        assert isinstance(r, QdiscRecord) and r.mode == "qdisc" and r.previous is not None
        assert {k: v for k, v in tbf.items() if k != "ifindex"} == {k: v for k, v in r.previous.to_json().items()
                                                                   if k != "ifindex"}
        assert cls.read_record({**ETH0, "direction": "egress", "previous": None}).previous is None
        assert cls.read_record(ingress).ifb == "ck0123456789"
    assert Netem.read_record({**egress, "mode": "qdisc", "mode_reason": "auto: this kernel has sch_netem"}).mode_reason
    queue = {**QUEUE, "mode_reason": "mode: queue asked", "stats": f"/tmp/{NETEMQ}.json",
             "helper": {"pid": 12345, "start_time": 678, "comm": "netemq"}, "queue": 20001}
    r = Netem.read_record(queue)
    assert isinstance(r, QueueRecord) and r.helper == ProcessRef(12345, 678, "netemq") and r.queue == 20001
    assert Netem.read_record({**QUEUE, "stats": f"/tmp/{NETEMQ}.json"}).helper is None  # as prepare writes it
    other_ns = {**NS, "ns_inode": 1}  # the path names another namespace now: nothing is touched
    for record in ({**egress, **other_ns}, {**queue, **other_ns, "helper": None}):
        assert not Netem.observe(record)
    Bandwidth.revert({**egress, **other_ns})
