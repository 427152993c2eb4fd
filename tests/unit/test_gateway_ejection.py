"""The reference gateway's ejection rule (latency mode): a slow replica is ejected while another one serves;
slowness alone never ejects the last healthy one (a check that fails outright still does)."""

from __future__ import annotations

import asyncio

from chaoskit.reference.gateway import Gateway, GatewayConfig

SLOW = {"status": 200, "latency_ms": 812.0, "reason": "latency 812 ms > 500 ms", "slow": True}
FAST = {"status": 200, "latency_ms": 40.0}


def gateway() -> Gateway:
    return Gateway(GatewayConfig(replicas=[{"name": "a", "url": "http://127.0.0.1:9"},
                                           {"name": "b", "url": "http://127.0.0.1:10"}],
                                 health_mode="latency", latency_check={"path": "/check"}))


def test_a_slow_check_ejects_a_replica_but_not_the_last_healthy_one():
    g = gateway()
    a, b = g.replicas
    g.checked(a, False, SLOW)
    assert (a.healthy, a.ejections) == (False, 1) and a.last_check["ejected"] == SLOW["reason"]
    g.checked(b, False, SLOW)  # a busy box: the one replica left answers slowly too
    assert (b.healthy, b.ejections) == (True, 0) and "last healthy replica" in b.last_check["kept"]
    assert g.pick() is b
    g.checked(b, False, {"error": "ClientConnectorError: refused"})  # not slow: gone
    assert not b.healthy and g.pick() is None


def test_a_slow_check_keeps_an_ejected_replica_out():
    g = gateway()
    a, b = g.replicas
    g.cfg.ejection_s = 0.0
    g.checked(a, False, SLOW)
    g.checked(a, True, FAST)
    g.checked(b, False, SLOW)  # kept: a is out
    g.checked(a, False, SLOW)  # a is out and slow: its passes start again
    g.checked(a, True, FAST)
    assert not a.healthy and a.passes == 1
    g.checked(a, True, FAST)
    assert a.healthy


def test_an_ejected_replica_comes_back_early_only_while_none_in_rotation_passes_its_checks():
    g = gateway()
    a, b = g.replicas
    g.eject(b, "served a request in 612 ms > 500 ms")  # a slow moment of a busy host: out for 30 s
    g.checked(b, True, FAST)
    g.checked(b, True, FAST)
    assert not b.healthy  # a, in rotation, has not failed a check: b waits out its ejection time
    g.checked(a, False, SLOW)  # a fails: kept, the last healthy one
    assert a.healthy and not b.healthy
    g.checked(b, True, FAST)  # b passes while a fails: back before its time, and a, kept only as the last, out
    assert b.healthy and not a.healthy and a.last_check["ejected"] == SLOW["reason"]
    assert g.pick() is b and g.pick() is b
    g.checked(a, True, FAST)
    g.checked(a, True, FAST)
    assert not a.healthy  # b passes (it never failed since): a waits out its own ejection time


def test_a_check_that_times_out_is_slow_in_latency_mode():
    g = gateway()
    a, b = g.replicas
    g.checked(a, False, SLOW)
    g.checked(b, False, {"error": "TimeoutError: ", "reason": "no answer within 2 s", "slow": True})
    assert b.healthy and "last healthy replica" in b.last_check["kept"]


def test_a_check_in_flight_across_a_settings_switch_is_not_applied():
    """A latency check that ends after the switch back to status mode (and a lower threshold) ejected a replica
    there (seen on a reused vLLM pair: `vllm-1 ejected (latency 588 ms > 500 ms)` after the run's end)."""
    g = gateway()
    a, _b = g.replicas
    g.cfg.check_every_s = 60.0
    started, release = asyncio.Event(), asyncio.Event()

    async def check(r):
        started.set()
        await release.wait()
        return False, SLOW

    async def main() -> None:
        g.check = check
        loop = asyncio.create_task(g._check_loop(a))
        await started.wait()
        g.switch("status", 500.0)
        release.set()
        await asyncio.sleep(0.05)
        loop.cancel()

    asyncio.run(main())
    assert a.healthy and a.ejections == 0 and a.last_check == {}
