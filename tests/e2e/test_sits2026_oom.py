"""experiments/sits2026/oom-kills-healthy-replica.yaml through the CLI, once: it brings up two Triton replicas,
memory-limits replica 0 with a holder beside it, and the kernel OOM-kills one of replica 0's processes; the run
ends with exactly the documented exit code, a complete rollback, and nothing left behind."""

from __future__ import annotations

from pathlib import Path

import pytest

from chaoskit.errors import EXIT_DEVIATED
from tests.conftest import bcc_missing, requires_triton
from tests.e2e.test_sits2026 import run_scenario, values

REASON = bcc_missing("oom_kills")
pytestmark = pytest.mark.skipif(REASON is not None, reason=f"eBPF unavailable: {REASON}")


@requires_triton
def test_oom_kills_a_healthy_replica_and_the_gateway_never_notices(tmp_path, state_dir):
    code, s, out = run_scenario("oom-kills-healthy-replica", tmp_path, state_dir, "duration=8s")
    kills = values(s, "kernel-oom-kills", "during", "count")
    victims = values(s, "kernel-oom-kills", "during", "victims")
    print(f"\noom kills in replica 0's tree during the method: {sum(kills)} ({'; '.join(v for v in victims if v)})")
    assert code == EXIT_DEVIATED, out
    assert sum(kills) >= 1, out
    assert s["rollback_complete"], out
    assert all(x["verdict"] == "ok" for x in s["samples"] if x["probe"] == "replica-0-ejections"), out  # blind spot
    fault = next(f for f in s["faults"] if f["type"] == "process.memory_limit")
    seen = fault["observed_before_revert"]
    assert seen["gone"] and (seen["oom_kills"] is None or seen["oom_kills"] >= 1), seen
    assert not Path(seen["cgroup"]).exists()
