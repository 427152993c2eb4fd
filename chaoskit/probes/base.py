"""The probe contract: measure() returns a flat dict of named values that `expect` tolerances judge."""

from __future__ import annotations

import difflib
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from pydantic import BaseModel, Field, model_validator
from pydantic_core import PydanticCustomError

from chaoskit.model.types import Duration, StrictModel, ToleranceSpec

if TYPE_CHECKING:
    import aiohttp


@dataclass(frozen=True)
class RequestTarget:
    """Where a probe sends its requests and how long it waits for each one (what the experiment's lint needs to
    tell whether a fault that holds requests holds this probe's). `url_path`: every request goes to the URL's own
    path; False: the probe adds its API's paths to a base URL."""

    url: str
    timeout: float
    url_path: bool = False


@dataclass(frozen=True)
class AlertWatch:
    """The alerts a probe expects the faults to raise (the alert probe): the keys it reads them under, how soon
    each must fire after a fault's apply and be gone after its revert, and the steps whose faults count (none:
    every fault). The report scores each fault window against them (MTTD/MTTR)."""

    probe: str
    alerts: tuple[str, ...]
    detect_within: float
    resolve_within: float
    steps: tuple[str, ...] = ()


class ProbeSpecBase(StrictModel):
    """Fields every probe has, and what generic code asks of a probe's spec (each with a default for the probes
    it does not concern)."""

    name: str = Field(min_length=1, pattern=r"^[A-Za-z0-9_.\-]+$", description="unique probe name")
    timeout: Duration = Field(10.0, gt=0, description="a measurement slower than this is an error result")
    phases: list[str] = Field(["before", "during", "after"],
                              description="when the steady state uses it: before, during, after")
    expect: dict[str, ToleranceSpec | dict[str, ToleranceSpec]] = Field(
        default_factory=dict, description="tolerances on measured values; nested maps for headers/json")

    expect_keys: ClassVar[tuple[str, ...]] = ()  # allowed keys; a trailing '.' allows a nested map
    expect_patterns: ClassVar[tuple[str, ...]] = ()  # regexes of computed keys (the published schema's)

    @model_validator(mode="after")
    def _check(self) -> ProbeSpecBase:
        bad = [p for p in self.phases if p not in ("before", "during", "after")]
        if bad:
            raise ValueError(f"phases: unknown phase '{bad[0]}' (use before, during, after)")
        for key, value in self.expect.items():
            nested = key + "." in self.expect_keys
            if not nested and (why := self.unknown_key(key)):
                raise expect_key_error(key, why)
            if nested != isinstance(value, dict):
                raise expect_key_error(key, "expected a map of name: tolerance" if nested
                                       else "expected a tolerance, not a map")
        for key, tol in self.flat_expect().items():
            if tol.relative and "before" not in self.phases:
                raise ValueError(f"expect.{key}: '{tol}' compares with this probe's {key} in the before phase, "
                                 f"but its phases ({', '.join(self.phases)}) leave out before")
        return self

    def unknown_key(self, key: str) -> str | None:
        """Why `key` cannot be in expect (None: it can). Probes with computed keys override this."""
        if key in self.expect_keys:
            return None
        allowed = [k.rstrip(".") for k in self.expect_keys]
        hint = difflib.get_close_matches(key, allowed, n=1)
        return f"unknown key '{key}' for this probe" + (f" (did you mean '{hint[0]}'?)" if hint else
                                                          f"; it measures: {', '.join(allowed)}")

    def request_target(self) -> RequestTarget | None:
        """For a probe that sends requests: where to and its per-request timeout; None for the others."""
        return None

    def after_notes(self, within: float) -> list[str]:
        """Notes for the run to show before it starts when the after phase waits at most `within` seconds for the
        steady state (e.g. a probe that needs longer than that to see it); none by default."""
        return []

    def alert_watch(self) -> AlertWatch | None:
        """For a probe that reads alerts the faults should raise: which, and their deadlines; None for the others."""
        return None

    def flat_expect(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for key, value in self.expect.items():
            if isinstance(value, dict):
                out.update({f"{key}.{k}": v for k, v in value.items()})
            else:
                out[key] = value
        return out


def expect_key_error(key: str, why: str) -> PydanticCustomError:
    """An error about one `expect` key: the loader reports it at that key's own line (type "expect_key")."""
    return PydanticCustomError("expect_key", "{why}", {"key": key, "why": why.removeprefix("expect: ")})


class Probe(ABC):
    """One kind of measurement. Instances live for the whole run (continuous probes keep state)."""

    type: ClassVar[str]
    summary: ClassVar[str]
    Spec: ClassVar[type[BaseModel]]
    # what `chaoskit doctor` checks the host for on its behalf (ids of doctor's checks, as Injector.host_needs)
    host_needs: ClassVar[frozenset[str]] = frozenset()

    def __init__(self, spec: Any):
        self.spec = spec

    def preflight(self) -> None:
        """Raise PreflightError if this host cannot run the probe."""

    @abstractmethod
    async def measure(self) -> dict[str, Any]:
        """Take one measurement. Exceptions become `error` results, never engine crashes."""

    def missing(self, key: str, values: dict[str, Any]) -> str:
        """Why an expected key is absent from a measurement (probes that know say more)."""
        return "not measured"

    def note_fault(self, ev: Any) -> None:
        """A fault applied or reverted (a model.events FaultApplied / FaultReverted, as the journal gets it):
        probes that judge fault windows (alert, kube.nodes) start or stop their clocks here."""

    async def close(self) -> None:
        """Release what the probe holds (sessions, BPF programs)."""


def http_session(timeout: float | None = None) -> aiohttp.ClientSession:
    """A probe's HTTP session (`timeout`: seconds a request may take in all; None: aiohttp's default). aiohttp
    is imported here, where a session is made, not where the probes load: it costs every chaoskit process ~0.1 s."""
    import aiohttp

    return aiohttp.ClientSession() if timeout is None else \
        aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout))
