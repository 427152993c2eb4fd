"""slo probe: drive open-loop load (chaoskit.load) and judge its latency percentiles, errors and goodput.

Two modes: `window` (each sample runs a fresh load of `load.duration`) and `continuous` (load runs from the
first sample to the end of the run; each sample reports what completed since the previous one, so a
deviation shows within one interval; where a fault's span ends a final sample takes the last partial window,
and with `over: phase` that final sample alone judges the whole span). With `group_by: HEADER` the outcomes are also broken down by that
response header's value (e.g. the replica a gateway picked): `p99_ms[triton-0]`, `error_rate[triton-0]` ...
Each error kind (recorder.ERROR_KINDS) is measured as `errors.KIND` (count) and `error_share.KIND` (of the
requests answered or failed), e.g. `expect: {error_share: {stream_truncated: "0.2..0.4"}}`.
Rates and shares divide by what the schedule held for the sample (`scheduled`): `completed_ratio` (ok answers),
`sent_on_time_ratio` (sends within 1 ms of their intended time), `completed_rps` (ok answers per second).
Percentiles come two ways: `p99_ms`, `ttft_p99_ms` ... over the successful requests only (a service failing
half its requests fast can look fast there), and `all_p99_ms`, `all_ttft_p99_ms` over every request that
ended, a failed or timed-out one counting at `load.timeout` (or the time it failed, if later): the key for
"users waited less than", since a failure never answers sooner than the user gives up."""

from __future__ import annotations

import asyncio
import difflib
import re
from typing import Any, ClassVar, Literal

from pydantic import Field, model_validator

from chaoskit.errors import ChaoskitError
from chaoskit.load.recorder import ERROR_KINDS, NO_GROUP, PYTHON_ONLY_KINDS, Recorder
from chaoskit.load.runner import ContinuousLoad, Part, run_load
from chaoskit.load.spec import LoadSpec
from chaoskit.model.types import Duration
from chaoskit.probes.base import Probe, ProbeSpecBase, RequestTarget
from chaoskit.probes.continuous import Continuous

_PCT = ("p50_ms", "p90_ms", "p99_ms", "p999_ms")
_OK_PCTS = (*_PCT, *(f"{m}_{p}" for m in ("service", "ttft", "itl", "tpot") for p in _PCT))  # successes only
_ALL_PCTS = tuple(f"all_{p}" for p in (*_PCT, *(f"ttft_{q}" for q in _PCT)))  # every request, failures at timeout
_PCTS = (*_OK_PCTS, *_ALL_PCTS)
_GROUP_KEYS = (*_PCTS, "requests", "ok", "error_rate", "goodput_rps", "output_tokens")  # known of each answer
_KEYS = (*_GROUP_KEYS, "scheduled", "sent", "sent_on_time", "sent_on_time_ratio", "completed_ratio", "completed_rps",
         "achieved_rps", "requested_rps", "late_sends", "late_share", "errors.", "error_share.")
_REMOVED = {"achieved_ratio": "achieved_ratio was removed: it divided sends by rate x duration, so a Poisson "
                              "schedule (a random count) deviated on a healthy server and a server answering "
                              "nothing still scored 1.0. Use completed_ratio (ok answers / scheduled sends) to "
                              "judge that the server keeps up, or sent_on_time_ratio (sends that left within 1 ms "
                              "of their time / scheduled) to judge the load generator"}
_GROUPED = re.compile(r"^([a-z0-9_]+)\[([^\[\]]+)\]$")
_TOKEN = r"^[!#$%&'*+.^_`|~0-9A-Za-z-]+$"  # an HTTP header name
CUT_TIMEOUT_S = 2.0  # the workers report a cut within ~10 ms; a fault's revert waits for it at most this long
SETTLE_S = 2.0  # a stopped load's requests in flight: the revert waits for them at most this long


class SloProbeSpec(ProbeSpecBase):
    type: Literal["slo"]
    load: LoadSpec = Field(description="the load the SLO is stated under (url, api, rate, duration, ...)")
    mode: Literal["window", "continuous"] = Field(
        "window", description="continuous: load runs for the whole experiment, samples report each interval. "
        "load.duration then does not end the load: it runs from the probe's first sample to the end of the run "
        "(with phases that leave out after: to the end of the last fault); duration must hold at least one send, "
        "and arrival ramp reaches ramp_to after it (then holds)")
    window: Duration = Field(2.0, gt=0, description="continuous: reporting window")
    over: Literal["window", "phase"] = Field(
        "window", description="continuous, during phase: window judges each sample (what completed since the "
        "previous one), and at the end of each fault a final sample judges the last partial window (with the "
        "window before it when shorter than one window); phase judges once, at the end of each fault (cut "
        "before its revert), over every request that completed from the first judged sample on, the last "
        "partial window included: the samples in between are recorded as interim (live view, safeguards), "
        "not judged. before/after samples judge one window either way")
    warmup: Duration = Field(0.0, ge=0, description="continuous: the load runs this long before the first "
                             "sample is measured (its windows are dropped: connection set-up, a sender starting "
                             "late, a cold cache), so a baseline is the steady state, not the start")
    timeout: Duration | None = Field(None, description="default: load duration (or window) + load timeout + 10s")
    group_by: str | None = Field(None, pattern=_TOKEN, description="a response header (e.g. X-Upstream-Replica): "
                                 "outcomes also per value as KEY[value], e.g. p99_ms[triton-0]; answers without "
                                 "it (connect errors, timeouts before the response head) in group 'none'. Needs "
                                 "the python sender (sender auto picks it)")
    expect_keys: ClassVar[tuple[str, ...]] = _KEYS
    expect_patterns: ClassVar[tuple[str, ...]] = (rf"^({'|'.join(_GROUP_KEYS)})\[[^\[\]]+\]$",)  # KEY[group]

    @model_validator(mode="after")
    def _timeout(self) -> SloProbeSpec:
        if self.timeout is None:
            span = self.window + self.warmup if self.mode == "continuous" else self.load.duration
            object.__setattr__(self, "timeout", span + self.load.timeout + 10.0)
        if self.over == "phase" and self.mode != "continuous":
            raise ValueError("over: phase needs mode: continuous (in window mode each sample runs a load of its "
                             "own and is judged alone)")
        if self.over == "phase" and "during" not in self.phases:
            raise ValueError(f"over: phase judges the during phase, but phases ({', '.join(self.phases)}) leave "
                             f"it out")
        if self.group_by is not None and self.load.sender == "native":
            raise ValueError(f"group_by: the native sender (load.sender: native) does not read response headers, "
                             f"so it cannot group by {self.group_by}; use load.sender: python or auto (auto "
                             f"picks python when group_by is set)")
        self._kinds()
        return self

    def request_target(self) -> RequestTarget:
        return RequestTarget(self.load.url, self.load.timeout)

    def _kinds(self) -> None:
        """errors.KIND / error_share.KIND name known kinds; a kind only the python sender tells apart makes
        sender auto pick python (and is an error with sender native)."""
        named = [(key, kind) for key in ("errors", "error_share") if isinstance(self.expect.get(key), dict)
                 for kind in self.expect[key]]  # type: ignore[union-attr]
        for key, kind in named:
            if kind not in ERROR_KINDS:
                close = difflib.get_close_matches(kind, ERROR_KINDS, n=1)
                raise ValueError(f"expect.{key}.{kind}: unknown error kind"
                                 + (f" (did you mean '{close[0]}'?)" if close else "")
                                 + f"; kinds: {', '.join(ERROR_KINDS)}")
        precise = sorted({kind for _, kind in named if kind in PYTHON_ONLY_KINDS})
        if precise and self.load.sender == "native":
            raise ValueError(f"expect names {', '.join(precise)}: the native sender (load.sender: native) counts "
                             "these as http_status or other; use load.sender: python or auto (auto picks python)")
        if precise and self.load.sender == "auto":
            object.__setattr__(self, "load", self.load.model_copy(update={"sender": "python"}))

    def unknown_key(self, key: str) -> str | None:
        if key in _REMOVED:
            return f"expect: {_REMOVED[key]}"
        m = _GROUPED.match(key)
        if m is None:
            return super().unknown_key(key)
        if self.group_by is None:
            return f"expect: '{key}' names a group, but the probe has no group_by (e.g. group_by: X-Upstream-Replica)"
        if m.group(1) not in _GROUP_KEYS:
            return (f"expect: '{m.group(1)}' is not measured per group (per group: "
                    f"{', '.join(_GROUP_KEYS)})")
        return None

    def expected_groups(self) -> set[str]:
        """The groups the tolerances name (so a group that got no answer at all still reports requests 0)."""
        return {m.group(2) for key in self.expect if (m := _GROUPED.match(key))}


class SloProbe(Probe, Continuous):
    type: ClassVar[str] = "slo"
    host_needs: ClassVar[frozenset[str]] = frozenset({"native-sender"})
    summary: ClassVar[str] = "open-loop load (CO-corrected) judged on p50..p99.9, errors, goodput, completed share"
    Spec = SloProbeSpec
    spec: SloProbeSpec

    def __init__(self, spec: SloProbeSpec):
        super().__init__(spec)
        self._continuous: ContinuousLoad | None = None
        self._loads = 0  # loads started (the first one, then one after each cut)
        self._warm = False  # the warm-up windows are behind it
        self._stopped = False  # its load was stopped: its last phase has ended
        self._draining = False  # stopped by a cut: end_phase waits for the requests in flight
        self._drained = asyncio.Event()  # cleared from a cut to the end of its drain: no new load starts before
        self._drained.set()
        self._phase: Part | None = None  # over: phase: what the current span's samples reported so far
        self._last: Part | None = None  # the span's latest window (a short final one is judged with it)
        self._tail: Part | None = None  # what the cut left
        self._span: tuple[Part | None, Part | None] = (None, None)  # (_phase, _last) as the cut found them

    async def measure(self) -> dict[str, Any]:
        if self.spec.mode == "window":
            summary = await run_load(self.spec.load, group_by=self.spec.group_by)
            summary.pop("recorder", None)
            return self._values(summary)
        part = await self._window()
        if self._phase is not None:
            self._phase.merge(part)
        self._last = part
        return self._values(part.summary(self.spec.load.rate))

    def _values(self, summary: dict[str, Any]) -> dict[str, Any]:
        done = summary["requests"]
        for kind in ERROR_KINDS:  # every kind, so "== 0" holds on a sample that had none
            n = summary["errors"].get(kind, 0)
            summary[f"errors.{kind}"] = n
            summary[f"error_share.{kind}"] = n / done if done else 0.0
        if self.spec.group_by is not None:
            for group in self.spec.expected_groups() | {NO_GROUP}:
                summary.setdefault(f"requests[{group}]", 0)  # no answer carried this value: say so, as a number
        return summary

    async def _window(self) -> Part:
        """The next window of the running load; a load a span's cut stopped is drained into that span's final
        sample first, then a new one starts (its requests all sent after the cut)."""
        while True:
            if self._stopped:
                raise ChaoskitError("its load was stopped at the end of the probe's last phase")
            await self._drained.wait()
            if self._continuous is None:  # the first sample, or the first after a span's cut
                self._continuous = await self._start()
                self._loads += 1
                if not self._warm:  # once: a load started again after a revert is measured from its first send
                    await self._warm_up()
            load = self._continuous
            try:
                return await load.window(timeout=self.spec.timeout or 60.0)
            except ChaoskitError:
                if not load.stopped:
                    raise  # else a cut stopped it while this sample waited: take the next load's window

    async def _start(self) -> ContinuousLoad:
        """A new running load; one whose start is cancelled (its sampler stopped) is closed, not kept half-made."""
        load = ContinuousLoad(self.spec.load, self.spec.window, group_by=self.spec.group_by)
        try:
            await load.start()
        except BaseException:
            await asyncio.shield(load.close())
            raise
        return load

    async def _warm_up(self) -> None:
        assert self._continuous is not None
        dropped = 0.0
        while dropped < self.spec.warmup:
            dropped += (await self._continuous.window(timeout=self.spec.timeout or 60.0)).elapsed_s
        self._warm = True

    # -- the end of a span with a fault in effect (Continuous) ------------------------------------------
    @property
    def is_continuous(self) -> bool:
        return self.spec.mode == "continuous"

    @property
    def over_phase(self) -> bool:
        return self.spec.over == "phase"

    @property
    def loads_started(self) -> int:
        return self._loads

    def begin_phase(self) -> None:
        self._phase = Part(Recorder(), 0.0, 0) if self.over_phase else None
        self._last = self._tail = None

    async def cut(self, stop: bool) -> None:
        """The load stops sending here, so every request of the span is judged in the span's final sample, never
        in a later phase (a request stuck in a fault's delay is not the after phase's, nor its recovery time);
        without `stop` the next sample starts a new load, whose requests are all sent after the revert."""
        load = self._continuous
        self._stopped = stop
        if load is None or not self._warm:  # nothing measured in the span yet
            self._span, self._phase, self._last = (self._phase, None), None, None
            self._tail = Part(Recorder(), 0.0, 0)
            if stop:
                await self.close()
            return
        self._draining = True
        self._drained.clear()
        self._span, self._phase, self._last = (self._phase, self._last), None, None
        # no window() takes anything from here on; with `stop` (the probe's last phase) the requests in flight
        # end before the revert if they can, else they end after it, still judged here
        await load.stop(CUT_TIMEOUT_S, settle_s=min(SETTLE_S, self.spec.load.timeout) if stop else 0.0)

    async def end_phase(self) -> dict[str, Any]:
        if self._draining:
            assert self._continuous is not None
            self._draining = False
            try:
                tail = await self._continuous.drain(self.spec.load.timeout + CUT_TIMEOUT_S)
            finally:
                await self.close()
                self._drained.set()
        else:
            tail, self._tail = self._tail or Part(Recorder(), 0.0, 0), None
        (whole, last), self._span = self._span, (None, None)
        carried = 0
        if whole is None and last is not None and tail.elapsed_s < self.spec.window:
            whole, carried = Part(Recorder(), 0.0, 0), last.rec.ok + sum(last.rec.errors.values())
            whole.merge(last)  # a short final window is judged with the one before it, not alone
        if whole is not None:
            whole.merge(tail)
            tail = whole
        values = self._values(tail.summary(self.spec.load.rate))
        values["carried_requests"] = carried  # judged again here: they were in the previous sample too
        return values

    def missing(self, key: str, values: dict[str, Any]) -> str:
        m = _GROUPED.match(key)
        name, group = (m.group(1), m.group(2)) if m else (key, None)
        if name not in _PCTS:
            return "not measured"
        at = f"[{group}]" if group else ""
        if name in _ALL_PCTS:
            return (f"not measured: no request{f' to {group}' if group else ''} ended in this sample "
                    f"(requests{at} {values.get(f'requests{at}', 0)})")
        return (f"not measured: no answer{f' from {group}' if group else ''} completed successfully in this sample "
                f"(requests{at} {values.get(f'requests{at}', 0)}, ok{at} {values.get(f'ok{at}', 0)})")

    async def close(self) -> None:
        if self._continuous is not None:
            await self._continuous.close()
            self._continuous = None
