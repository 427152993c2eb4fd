"""The reference deployment's vLLM replicas each get CPUs of their own (VLLM_CPU_OMP_THREADS_BIND per replica)."""

from __future__ import annotations

import pytest

from chaoskit.reference.vllm import cpu_binds


@pytest.mark.parametrize("replicas, cpus, binds", [
    (2, [0, 1], ["0", "1"]),
    (2, [4, 5, 6, 7, 0, 1, 2, 3], ["0,1,2,3", "4,5,6,7"]),
    (3, list(range(8)), ["0,1", "2,3", "4,5"]),
    (3, [0, 1], ["0", "1", "0"]),  # fewer CPUs than replicas: they wrap
    (1, [0, 1], [None]),  # one replica: vLLM's own choice
])
def test_disjoint_slices_per_replica(monkeypatch, replicas, cpus, binds):
    monkeypatch.delenv("VLLM_CPU_OMP_THREADS_BIND", raising=False)
    assert cpu_binds(replicas, cpus) == binds


def test_the_users_own_setting_is_left_alone(monkeypatch):
    monkeypatch.setenv("VLLM_CPU_OMP_THREADS_BIND", "nobind")
    assert cpu_binds(2, [0, 1]) == [None, None]
