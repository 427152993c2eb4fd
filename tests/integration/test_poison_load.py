"""load.poison: one request with a file's text as its prompt, sent once at its time among the load's requests
(python sender; the native one is refused), and not at all when the load is stopped before its time."""

from __future__ import annotations

import asyncio
import itertools
import json
import time
from collections.abc import Callable

import pytest
from aiohttp import web
from pydantic import ValidationError

from chaoskit.load import generator, native
from chaoskit.load.recorder import Recorder
from chaoskit.load.spec import LoadSpec
from tests.helpers.aioserve import serve


async def _serve(prompts: list[tuple[float, str]]) -> tuple[web.AppRunner, str]:
    async def handle(request: web.Request) -> web.Response:
        prompts.append((time.monotonic(), (await request.json())["inputs"][0]["data"][0]))  # KServe v2 infer
        return web.json_response({"outputs": [{"name": "text_output", "datatype": "BYTES", "shape": [1, 1],
                                               "data": ["ok"]}]})

    app = web.Application()
    app.router.add_post("/v2/models/tiny_lm/infer", handle)
    return await serve(app)


async def _load(tmp_path, stop: Callable[[], bool] | None) -> tuple[list[tuple[float, str]], Recorder, float]:
    prompts: list[tuple[float, str]] = []
    runner, url = await _serve(prompts)
    (tmp_path / "poison.txt").write_text("kill me: POISON\n")
    spec = LoadSpec(url=url, api="triton", model="tiny_lm", stream=False, rate=20,
                    duration=0.5, arrival="constant", prompt_tokens=8,
                    poison={"file": str(tmp_path / "poison.txt"), "at": 0.2})
    assert native.choose(spec) == "python"
    rec, start = Recorder(), time.time() + 0.05
    try:
        await generator.run(spec, [i / 20 for i in range(10)], start, rec, stopped=stop)
    finally:
        await runner.cleanup()
    return prompts, rec, time.monotonic() + (start - time.time())


def test_the_poison_goes_once_at_its_time(tmp_path):
    prompts, rec, t0 = asyncio.run(_load(tmp_path, stop=None))
    poison = [t - t0 for t, p in prompts if p == "kill me: POISON"]
    assert len(poison) == 1 and 0.2 <= poison[0] < 0.3 and len(prompts) == 11 and rec.ok == rec.sent == 11


def late_once() -> Callable[[], bool]:
    """Stopped from the start, and the first look at it holds the loop past the poison's time (0.2 s), as a busy
    box did once: the poison was sent at its time all the same."""
    calls = itertools.count()

    def stopped() -> bool:
        if next(calls) == 0:
            time.sleep(0.4)
        return True

    return stopped


@pytest.mark.parametrize("stop", [lambda: True, late_once()], ids=["at-once", "loop-late"])
def test_a_load_stopped_before_its_time_sends_no_poison(tmp_path, stop):
    prompts, rec, _ = asyncio.run(_load(tmp_path, stop=stop))
    assert prompts == [] and rec.sent == 0


def test_the_native_sender_a_missing_file_and_a_late_poison_are_refused(tmp_path):
    prompt = tmp_path / "p.txt"
    prompt.write_text("kill me")
    with pytest.raises(ValidationError, match="poison needs the python sender"):
        LoadSpec(url="http://127.0.0.1:1", rate=1, duration=1, sender="native", poison={"file": str(prompt)})
    with pytest.raises(ValidationError, match="poison.file '/nonexistent/p.txt': no such file"):
        LoadSpec(url="http://127.0.0.1:1", rate=1, duration=1, poison={"file": "/nonexistent/p.txt"})
    with pytest.raises(ValidationError, match=r"poison.at \(2s\) must come before the load's end \(duration 1s\)"):
        LoadSpec(url="http://127.0.0.1:1", rate=1, duration=1, poison={"file": str(prompt), "at": 2})
    assert json.loads(LoadSpec(url="http://127.0.0.1:1", rate=1, duration=1).model_dump_json())["poison"] is None
