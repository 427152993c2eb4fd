"""The reference deployment's ledger types revert from their typed records: a real gateway's health settings,
switched for a run, are switched back by a fresh process given only the record; a gateway that is gone, or a
deployment directory with nothing left in it, revert as no-ops; a record that does not read back is refused."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from chaoskit.injectors.base import RecordError
from chaoskit.reference.injectors import ReferenceDeployment, ReferenceGateway
from chaoskit.reference.scenario import gateway_health, set_gateway_health
from tests.conftest import ROOT, free_port

REVERT = "import json, sys; from chaoskit.injectors import injector_class; " \
         "cls = injector_class(sys.argv[1]); cls.revert(cls.from_ledger(json.loads(sys.argv[2])))"


@pytest.fixture
def gateway(tmp_path: Path) -> Iterator[tuple[str, subprocess.Popen]]:
    """A real reference gateway (no replicas) on a free port: (its URL, its process)."""
    port = free_port()
    cfg = tmp_path / "gateway.json"
    cfg.write_text(json.dumps({"listen_port": port, "replicas": []}))
    proc = subprocess.Popen([sys.executable, "-m", "chaoskit.reference.gateway", str(cfg)], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        yield f"http://127.0.0.1:{port}", proc
    finally:
        proc.kill()
        proc.communicate()


def revert_in_a_fresh_process(type_name: str, record: dict) -> None:
    subprocess.run([sys.executable, "-c", REVERT, type_name, json.dumps(record)], cwd=ROOT, check=True, timeout=60)


def test_a_switched_gateway_is_switched_back_from_the_record_alone(gateway):
    url, proc = gateway
    previous = gateway_health(url)
    assert previous == {"health_mode": "status", "latency_threshold_ms": 500.0}
    set_gateway_health(url, {"health_mode": "latency", "latency_threshold_ms": 250})
    record = {"url": url, "previous": previous}  # as the run writes it to the ledger
    r = ReferenceGateway.from_ledger(record)
    assert ReferenceGateway.observe(r) and r.previous.health_mode == "status"
    revert_in_a_fresh_process("reference.gateway", record)
    assert gateway_health(url) == previous and not ReferenceGateway.observe(r)
    proc.kill()
    proc.communicate()
    revert_in_a_fresh_process("reference.gateway", record)  # the gateway is gone: nothing to switch back
    assert not ReferenceGateway.observe(r)


def test_a_deployment_with_nothing_left_reverts_as_a_no_op(tmp_path):
    record = {"dir": str(tmp_path / "ref")}
    revert_in_a_fresh_process("reference.deployment", record)
    assert not ReferenceDeployment.observe(ReferenceDeployment.from_ledger(record))


@pytest.mark.parametrize(("cls", "record", "wrong"), [
    (ReferenceGateway, {"url": "127.0.0.1:8000", "previous": {"health_mode": "status", "latency_threshold_ms": 1}},
     "(url: String should match pattern '^https?://')"),
    (ReferenceGateway, {"url": "http://127.0.0.1:8000", "previous": {}},
     "(previous.health_mode: Field required; previous.latency_threshold_ms: Field required)"),
    (ReferenceDeployment, {}, "(dir: Field required)"),
])
def test_a_record_that_does_not_read_back_is_refused(cls, record, wrong):
    with pytest.raises(RecordError) as e:
        cls.revert(cls.from_ledger(record))
    assert str(e.value) == f"{cls.type}: its revert record does not read back {wrong}"
