"""A sampler cancelled in the same loop tick as its probe answers must still stop (Python 3.11's
asyncio.wait_for returned the answer and dropped the cancel: the run hung after the method)."""

from __future__ import annotations

import asyncio
import threading

import pytest

from chaoskit.engine.steady_state import take_sample


class GatedProbe:
    """Answers when the test opens the gate; stands in for any probe (no I/O needed)."""

    class spec:  # noqa: N801 - the attributes take_sample reads
        name, timeout = "gated", 5.0

        @staticmethod
        def flat_expect() -> dict:
            return {}

    def __init__(self) -> None:
        self.gate: asyncio.Future | None = None

    async def measure(self) -> dict:
        self.gate = asyncio.get_running_loop().create_future()
        return await self.gate


def test_cancel_in_the_tick_the_probe_answers_is_not_swallowed():
    async def main() -> None:
        probe = GatedProbe()
        task = asyncio.create_task(take_sample(probe, "during"))
        while probe.gate is None:
            await asyncio.sleep(0)
        probe.gate.set_result({})  # the answer and the cancel arrive together
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main())


class SwallowingProbe:
    """A probe that eats every cancel (as a careless client library might) and answers anyway."""

    def __init__(self, spec) -> None:
        self.spec = spec

    async def measure(self) -> dict:
        try:
            await asyncio.sleep(0.05)
        except asyncio.CancelledError:
            pass
        return {"exit_code": 0}


EXPERIMENT = """\
apiVersion: chaoskit/v1
kind: Experiment
metadata: {name: swallow}
steadyState:
  probes:
    - {name: p, type: command, argv: ["true"]}
method:
  - pause: 300ms
safeguards:
  - {probe: p, abort_when: "exit_code != 0", every: 10ms}
"""


def test_the_method_ends_even_when_a_probe_swallows_the_cancel(tmp_path):
    from chaoskit.engine.journal import Journal, read_journal
    from chaoskit.engine.runner import Runner
    from chaoskit.experiment.loader import load_experiment
    from chaoskit.model.events import Sample

    f = tmp_path / "e.yaml"
    f.write_text(EXPERIMENT)
    runner = Runner(load_experiment(f).experiment, Journal(tmp_path / "journal.jsonl"))
    runner._preflight()
    runner.probes["p"] = SwallowingProbe(runner.probes["p"].spec)  # type: ignore[assignment]

    result: list = []
    # on a thread: a regression hangs the loop for good (the swallowed cancel includes any timeout's)
    t = threading.Thread(target=lambda: result.append(asyncio.run(runner._method())), daemon=True)
    t.start()
    t.join(10)
    assert not t.is_alive(), "the method never ended: a sampler went on after its cancel"
    assert result == [None]
    assert sum(isinstance(e, Sample) for e in read_journal(tmp_path / "journal.jsonl")) >= 3
