"""Executors in the ledger: every intent names its executor (and placement), old ledgers read as local, and
rollback and the watchdog revert each entry through the executor that applied it."""

from __future__ import annotations

import json
import os
import signal
import time
from typing import Any

import pytest

from chaoskit.engine import rollback as rollback_mod
from chaoskit.engine import watchdog
from chaoskit.engine.ledger import Ledger
from chaoskit.engine.rollback import revert_entry, rollback
from chaoskit.executors import UnknownExecutor, get_executor, route_of
from chaoskit.executors.local import LocalExecutor
from chaoskit.injectors.base import FaultContext
from chaoskit.injectors.placement import HelperPlacement
from chaoskit.injectors.process.fault import ProcessSignal
from chaoskit.targets.kube import ClusterRef
from chaoskit.targets.process import proc_ref
from tests.conftest import proc_state, wait_for

PLACEMENT = {"node": "node-a", "pod": "web-0", "namespace": "default", "uid": "u-1", "container_id": "containerd://1"}


def _lines(ledger: Ledger) -> list[dict[str, Any]]:
    return [json.loads(line) for line in ledger.path.read_text().splitlines()]


def test_intent_records_executor_and_placement_and_reads_them_back(tmp_path):
    ledger = Ledger.create("r1", "x", tmp_path)
    local_id = ledger.intent("process.signal", {"a": 1}, ["p"])
    helper_id = ledger.intent("network.netem", {"b": 2}, ["q"], executor="k8s-helper", placement=PLACEMENT)
    intents = [line for line in _lines(ledger) if line["op"] == "intent"]
    assert intents[0]["executor"] == "local" and "placement" not in intents[0]
    assert intents[1]["executor"] == "k8s-helper" and intents[1]["placement"] == PLACEMENT
    entries = ledger.read().entries
    assert (entries[local_id].executor, entries[local_id].placement) == ("local", None)
    assert (entries[helper_id].executor, entries[helper_id].placement) == ("k8s-helper", PLACEMENT)


def test_applied_keeps_the_executor_of_the_intent(tmp_path):
    ledger = Ledger.create("r2", "x", tmp_path)
    entry_id = ledger.intent("network.netem", {"b": 2}, [], executor="k8s-helper", placement=PLACEMENT)
    ledger.applied(entry_id, {"b": 3})
    entry = ledger.read().entries[entry_id]
    assert entry.applied and entry.record == {"b": 3} and entry.executor == "k8s-helper"
    assert entry.placement == PLACEMENT


@pytest.fixture
def stopped(sleeper):
    os.kill(sleeper.pid, signal.SIGSTOP)
    wait_for(lambda: proc_state(sleeper.pid) == "T")
    return {"signal": "SIGSTOP", "targets": [proc_ref(sleeper.pid).to_json()]}


def test_an_old_ledger_without_executor_reads_as_local_and_rolls_back(tmp_path, sleeper, stopped):
    path = tmp_path / "old.jsonl"
    old = [{"op": "open", "run_id": "old", "experiment": "x", "owner": None, "t": 1.0},
           {"op": "intent", "id": 1, "type": "process.signal", "record": stopped, "plan": [], "expires_at": None,
            "t": 2.0},
           {"op": "applied", "id": 1, "record": stopped, "expires_at": None, "t": 3.0}]
    path.write_text("".join(json.dumps(o) + "\n" for o in old))
    ledger = Ledger(path)
    entry = ledger.read().entries[1]
    assert entry.executor == "local" and entry.placement is None
    result = rollback(ledger)
    assert result.complete and [e.id for e in result.reverted] == [1]
    assert proc_state(sleeper.pid) in ("S", "R") and ledger.read().closed


def test_an_unknown_executor_fails_only_its_own_entry_loudly(tmp_path, sleeper, stopped):
    ledger = Ledger.create("r3", "x", tmp_path)
    local_id = ledger.intent("process.signal", stopped, [])
    ledger.applied(local_id, stopped)
    odd_id = ledger.intent("process.signal", stopped, [], executor="ssh-helper", placement={"host": "h"})
    result = rollback(ledger)
    assert [e.id for e in result.reverted] == [local_id]
    assert [(e.id, why) for e, why in result.failed] == [
        (odd_id, "unknown executor 'ssh-helper' (known: local, k8s-helper; ledger written by a newer chaoskit?)")]
    state = ledger.read()
    assert not state.closed and not state.entries[odd_id].reverted
    assert len(state.entries[odd_id].failures) == rollback_mod.RETRIES
    assert proc_state(sleeper.pid) in ("S", "R")  # the local entry was reverted all the same


class RecordingExecutor:
    """A second executor, to see that dispatch follows the entry's executor name (not the fault type)."""

    name = "k8s-helper"

    def __init__(self) -> None:
        self.calls: list[tuple[str, str, dict, Any]] = []

    def apply(self, injector, record, placement):
        raise AssertionError("not called here")

    def revert(self, type_name, record, placement):
        self.calls.append(("revert", type_name, record, placement))

    def observe(self, type_name, record, placement):
        self.calls.append(("observe", type_name, record, placement))
        return False

    def observe_details(self, type_name, record, placement):
        return {"in_effect": False}


@pytest.fixture
def recording(monkeypatch: pytest.MonkeyPatch) -> RecordingExecutor:
    rec = RecordingExecutor()
    monkeypatch.setattr(rollback_mod, "get_executor", lambda name: rec if name == "k8s-helper" else get_executor(name))
    return rec


def test_revert_entry_dispatches_through_the_entry_executor(tmp_path, recording):
    ledger = Ledger.create("r4", "x", tmp_path)
    entry_id = ledger.intent("network.netem", {"iface": "eth0"}, [], executor="k8s-helper", placement=PLACEMENT)
    assert revert_entry(ledger, ledger.read().entries[entry_id]) is None
    assert recording.calls == [("revert", "network.netem", {"iface": "eth0"}, PLACEMENT),
                               ("observe", "network.netem", {"iface": "eth0"}, PLACEMENT)]
    assert ledger.read().entries[entry_id].reverted


def test_the_watchdog_reverts_an_expired_entry_through_its_executor(tmp_path, recording):
    ledger = Ledger.create("r5", "x", tmp_path)
    entry_id = ledger.intent("network.netem", {"iface": "eth0"}, [], expires_at=time.time() - 1,
                             executor="k8s-helper", placement=PLACEMENT)
    watchdog._revert_expired(ledger, ledger.read())
    assert recording.calls[0] == ("revert", "network.netem", {"iface": "eth0"}, PLACEMENT)
    assert ledger.read().entries[entry_id].reverted


def test_registry_and_routes():
    assert isinstance(get_executor("local"), LocalExecutor)
    with pytest.raises(UnknownExecutor, match="unknown executor 'nope'"):
        get_executor("nope")
    stop = ProcessSignal(ProcessSignal.Spec.model_validate({"type": "process.signal", "pid": os.getpid()}))
    assert route_of(stop) == ("local", None)
    hp = HelperPlacement(cluster=ClusterRef(), node="node-a", run_id="r1", key="k1")
    placed = ProcessSignal(stop.spec, FaultContext(executor="k8s-helper", placement=hp))
    assert route_of(placed) == ("k8s-helper", hp.to_json())  # the ledger entry's: plain JSON
    assert route_of(placed)[1]["node"] == "node-a" and HelperPlacement.from_json(route_of(placed)[1]) == hp
