"""What `chaoskit status` says a fault holds, from its ledger record: a family's own words (Injector.holds) or,
by default, the record's fields in words (holdings.summary) - also for a family not installed here or a record
that does not read back."""

from __future__ import annotations

import subprocess
import sys
import uuid

from chaoskit.app.orphans import held
from chaoskit.engine.ledger import Entry
from chaoskit.injectors.holdings import summary


def test_a_record_in_words_processes_as_pids_and_a_token_as_the_processes_carrying_it():
    token = f"chaoskit-test-{uuid.uuid4().hex}"
    carrier = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", token])
    try:
        record = {"token": token, "holder": {"pid": 41, "start_time": 9, "comm": "python"},
                  "procs": [{"pid": p, "start_time": 1, "from": "/a"} for p in range(1, 11)],
                  "hierarchy": {"version": 2, "root": "/sys/fs/cgroup"}, "cgroup": "/sys/fs/cgroup/chaoskit-1",
                  "dedicated": False, "limit_bytes": None, "files": [], "peers": ["10.0.0.1", "10.0.0.2"]}
        assert summary(record) == [
            f"helper {token}: PID {carrier.pid} (python)",
            "holder: PID 41 (python)",
            "procs: PID 1, PID 2, PID 3, PID 4, PID 5, PID 6, PID 7, PID 8 and 2 more",
            "hierarchy.version: 2", "hierarchy.root: /sys/fs/cgroup",
            "cgroup: /sys/fs/cgroup/chaoskit-1", "dedicated: False", "peers: 10.0.0.1, 10.0.0.2"]
    finally:
        carrier.kill()
        carrier.wait()
    assert summary({"token": token}) == [f"helper {token}: no process carries it now"]


def test_a_family_without_words_of_its_own_says_its_record():
    entry = Entry(id=3, type="process.signal", applied=True,
                  record={"signal": "SIGSTOP", "targets": [{"pid": 77, "start_time": 5, "comm": "sleep"}]})
    assert held(entry).holds == ("signal: SIGSTOP", "targets: PID 77 (sleep)")


def test_an_unknown_family_or_a_torn_record_is_still_listed_by_its_fields():
    unknown = held(Entry(id=1, type="demo.nowhere", record={"path": "/tmp/x"}))
    assert unknown.holds[0] == "path: /tmp/x" and "demo.nowhere did not describe it" in unknown.holds[1]
    torn = held(Entry(id=2, type="network.drop", record={"ns": "/run/netns/x", "table": "not-ours"}))
    assert torn.holds[:2] == ("ns: /run/netns/x", "table: not-ours")
    assert "RecordError" in torn.holds[2] and "ns_inode" in torn.holds[2], torn.holds


def test_a_fault_through_a_helper_pod_says_where():
    entry = Entry(id=1, type="process.signal", applied=True, record={"signal": "SIGSTOP"},
                  executor="k8s-helper", placement={"cluster": {"server": "https://x"}, "node": "node-a",
                                                    "run_id": "r", "targets": [{"namespace": "prod", "pod": "web-0"}]})
    assert held(entry).holds == ("through k8s-helper on node node-a, pods prod/web-0", "signal: SIGSTOP")
