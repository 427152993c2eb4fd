"""alert probe: the alerts an experiment expects, read from Prometheus or Alertmanager, judged against the fault
windows: each must fire within detect_within of a fault's apply and be gone within resolve_within of its revert."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from pydantic import Field, model_validator

from chaoskit.model.events import Event, FaultApplied, FaultReverted
from chaoskit.model.types import Duration, StrictModel, Url
from chaoskit.probes.base import AlertWatch, Probe, ProbeSpecBase, http_session

if TYPE_CHECKING:
    import aiohttp  # types only: http_session (probes.base) imports it where a session is made

ACTIVE = ("pending", "firing")
DEFAULT_EXPECT = {"late": "~ ^$", "waiting": "== 0"}  # no deadline missed; nothing awaited
EXAMPLE = {"name": "alerts", "type": "alert", "source": "prometheus", "url": "http://127.0.0.1:9090",
           "alerts": [{"name": "InferenceErrorRateHigh", "labels": {"service": "llm-gateway"}}],
           "detect_within": "30s", "resolve_within": "2m"}


class ExpectedAlert(StrictModel):
    name: str = Field(min_length=1, description="the alert's name (its alertname label)")
    labels: dict[str, str] = Field(default_factory=dict, description="labels the alert must have (exact match); "
                                   "any other labels may differ")
    id: str | None = Field(None, pattern=r"^[A-Za-z0-9_:\-]+$", description="its key in the measured values "
                           "(state.ID, firing.ID ...); default: its name")

    @property
    def key(self) -> str:
        return self.id or self.name

    def matches(self, labels: dict[str, str]) -> bool:
        return labels.get("alertname") == self.name and all(labels.get(k) == v for k, v in self.labels.items())


class AlertProbeSpec(ProbeSpecBase):
    model_config = {"json_schema_extra": {"examples": [EXAMPLE]}}

    type: Literal["alert"]
    source: Literal["prometheus", "alertmanager"] = Field(
        "prometheus", description="prometheus: GET URL/api/v1/alerts (pending and firing alerts); alertmanager: "
        "GET URL/api/v2/alerts (alerts Prometheus sent it: firing)")
    url: Url = Field(pattern=r"^https?://", description="the server's base URL, e.g. http://127.0.0.1:9090")
    alerts: list[ExpectedAlert] = Field(min_length=1, description="the alerts the faults should raise")
    detect_within: Duration = Field(30.0, gt=0, description="each alert must be firing this soon after each "
                                    "fault's apply (seen by a sample: sample often enough, steadyState.during.every)")
    resolve_within: Duration = Field(120.0, gt=0, description="and be gone this soon after the fault's revert; the "
                                     "after phase waits for it as long as steadyState.after.within allows (make that "
                                     "at least resolve_within)")
    steps: list[str] = Field(default_factory=list, description="the method steps (their names) whose faults the "
                             "alerts should detect; default: every fault")
    timeout: Duration = Field(5.0, gt=0, description="a reading slower than this counts as the source unreachable")
    expect_keys: ClassVar[tuple[str, ...]] = ("late", "overdue", "waiting", "noisy", "source_up", "source_error",
                                              "state.", "firing.", "pending.", "detect_s.", "resolve_s.")

    @model_validator(mode="before")
    @classmethod
    def _default_expect(cls, data: Any) -> Any:
        """Unless `expect` is given: late empty and waiting == 0 (every deadline met; the after phase waits)."""
        if isinstance(data, dict) and "expect" not in data:
            return {**data, "expect": dict(DEFAULT_EXPECT)}
        return data

    @model_validator(mode="after")
    def _unique(self) -> AlertProbeSpec:
        keys = [a.key for a in self.alerts]
        if dupes := sorted({k for k in keys if keys.count(k) > 1}):
            raise ValueError(f"alerts: {', '.join(dupes)} expected twice; give each an id")
        return self

    def alert_watch(self) -> AlertWatch:
        return AlertWatch(self.name, tuple(a.key for a in self.alerts), self.detect_within, self.resolve_within,
                          tuple(self.steps))

    def after_notes(self, within: float) -> list[str]:
        """resolve_within outlasting the after phase's wait: it gives up before the alerts had to resolve."""
        if "after" not in self.phases or self.resolve_within <= within:
            return []
        return [f"probe {self.name}: resolve_within {self.resolve_within:g}s is longer than steadyState.after.within "
                f"{within:g}s: the after phase stops waiting for its alerts to resolve before that"]


@dataclass
class Track:
    """One expected alert over one fault window: the first reading that saw it firing after the apply, the first
    that saw it gone after the revert, and the deadline it missed (kept once missed)."""

    alert: str
    fault: int
    step: str
    applied_at: float
    detect_within: float
    resolve_within: float
    reverted_at: float | None = None
    before: str | None = None  # its state at the last reading before the apply
    detected_at: float | None = None
    resolved_at: float | None = None
    late: str | None = None

    @property
    def detect_s(self) -> float | None:
        return None if self.detected_at is None else round(self.detected_at - self.applied_at, 3)

    @property
    def resolve_s(self) -> float | None:
        if self.resolved_at is None or self.reverted_at is None:
            return None
        return round(self.resolved_at - self.reverted_at, 3)

    def read(self, t: float, state: str) -> None:
        """A reading at `t` (when the answer came) of the alert's state."""
        if t < self.applied_at:
            self.before = state
            return
        if self.detected_at is None:
            if state == "firing":
                self.detected_at = t
        elif self.resolved_at is None and self.reverted_at is not None and t >= self.reverted_at \
                and state not in ACTIVE:
            self.resolved_at = t
        self._judge(t)

    def _judge(self, now: float) -> None:
        if self.late is not None:
            return
        fault = f"fault #{self.fault} {self.step}"
        if (self.detected_at or now) > self.applied_at + self.detect_within:
            seen = f"firing {self.detect_s:g}s after" if self.detected_at else "not firing"
            self.late = f"{self.alert}: {seen} {fault}'s apply (detect_within {self.detect_within:g}s)"
        elif self.reverted_at is not None and self.detected_at is not None and \
                (self.resolved_at or now) > self.reverted_at + self.resolve_within:
            seen = f"gone {self.resolve_s:g}s after" if self.resolved_at else "still active"
            self.late = f"{self.alert}: {seen} {fault}'s revert (resolve_within {self.resolve_within:g}s)"

    @property
    def undecided(self) -> bool:
        """Neither late nor done: its detection, or its resolution after the revert, is still awaited."""
        return self.late is None and (self.detected_at is None or self.resolved_at is None)


def alert_state(found: list[tuple[dict[str, str], str]], want: ExpectedAlert) -> str:
    """firing, pending or inactive: the most active of the alerts that match."""
    states = {state for labels, state in found if want.matches(labels)}
    return "firing" if "firing" in states else ("pending" if "pending" in states else "inactive")


def _ended(ends_at: Any, now: float) -> bool:
    try:
        return datetime.fromisoformat(str(ends_at).replace("Z", "+00:00")).timestamp() < now
    except ValueError:
        return False


def parse_alerts(source: str, data: Any, now: float) -> list[tuple[dict[str, str], str]]:
    """(labels, pending|firing) of each active alert in a Prometheus or Alertmanager answer."""
    if source == "prometheus":
        if not isinstance(data, dict) or data.get("status") != "success":
            raise RuntimeError(f"Prometheus answered {str(data)[:200]}")
        return [(a.get("labels") or {}, str(a.get("state"))) for a in data["data"]["alerts"]]
    if not isinstance(data, list):
        raise RuntimeError(f"Alertmanager answered {str(data)[:200]}")
    return [(a.get("labels") or {}, "firing") for a in data if not _ended(a.get("endsAt"), now)]


class AlertProbe(Probe):
    """Each sample reads the alerts once and records, for each expected alert, `state.ID` (inactive, pending,
    firing, or resolved once seen firing), `firing.ID` and `pending.ID` (1/0), and for the latest fault
    `detect_s.ID` / `resolve_s.ID`. `late` says which deadlines were missed (not firing within detect_within of
    an apply, still active resolve_within after a revert; empty when none) and `overdue` counts them; `waiting`
    counts detections or resolutions still awaited while none of its faults is in effect (so the after phase
    waits for them); `noisy` counts expected alerts seen active before any fault (a noisy rule: the report says
    so). Unless `expect` is given the probe holds while `late` is empty (`~ ^$`) and `waiting == 0`. An unreachable source is `source_up: 0` with `source_error`, never a
    failed sample (add `source_up: "== 1"` to expect to make it one). The run's report shows the time to detect
    and to resolve of each fault (MTTD/MTTR) from these samples and the fault windows."""

    type: ClassVar[str] = "alert"
    summary: ClassVar[str] = "expected alerts (Prometheus or Alertmanager): time to detect and resolve each fault"
    Spec = AlertProbeSpec
    spec: AlertProbeSpec

    def __init__(self, spec: AlertProbeSpec):
        super().__init__(spec)
        self._session: aiohttp.ClientSession | None = None
        self._lock = threading.Lock()  # faults are reverted (and journaled) from threads
        self._tracks: list[Track] = []
        self._open: set[int] = set()  # its faults in effect now
        self._last: dict[str, str] = {}  # alert key -> state at the latest reading
        self._noisy: set[str] = set()
        self._fired: set[str] = set()

    def note_fault(self, ev: Event) -> None:
        """A fault applied or reverted (the run's journal, through a sink): a new window, or its end."""
        with self._lock:
            if isinstance(ev, FaultApplied) and (not self.spec.steps or ev.step in self.spec.steps):
                self._open.add(ev.id)
                self._tracks += [Track(a.key, ev.id, ev.step, ev.applied_at or ev.t, self.spec.detect_within,
                                       self.spec.resolve_within, before=self._last.get(a.key))
                                 for a in self.spec.alerts]
            elif isinstance(ev, FaultReverted) and ev.id in self._open:
                self._open.discard(ev.id)
                for t in self._tracks:
                    if t.fault == ev.id:
                        t.reverted_at = ev.t

    async def _read(self) -> list[tuple[dict[str, str], str]]:
        if self._session is None:
            self._session = http_session(self.spec.timeout)
        path = "/api/v1/alerts" if self.spec.source == "prometheus" else "/api/v2/alerts"
        async with self._session.get(self.spec.url.rstrip("/") + path) as r:
            r.raise_for_status()
            data = await r.json(content_type=None)
        return parse_alerts(self.spec.source, data, time.time())

    async def measure(self) -> dict[str, Any]:
        try:
            found = await self._read()
        except Exception as e:  # the source is down: a warning in the values, never a changed verdict
            return self._values(None, f"{type(e).__name__}: {e}".strip())
        return self._values(found, None)

    def _values(self, found: list[tuple[dict[str, str], str]] | None, error: str | None) -> dict[str, Any]:
        now = time.time()
        out: dict[str, Any] = {"source_up": int(found is not None)}
        with self._lock:
            if found is not None:
                for a in self.spec.alerts:
                    self._reading(a.key, alert_state(found, a), now, out)
            else:
                out["source_error"] = error
            late = [t.late for t in self._tracks if t.late is not None]
            out["late"], out["overdue"] = "; ".join(late), len(late)
            waiting = found is not None and not self._open
            out["waiting"] = sum(t.undecided for t in self._tracks) if waiting else 0
            out["noisy"] = len(self._noisy)
            for a in self.spec.alerts:
                latest = [t for t in self._tracks if t.alert == a.key][-1:]
                for key in ("detect_s", "resolve_s"):
                    if latest and getattr(latest[0], key) is not None:
                        out[f"{key}.{a.key}"] = getattr(latest[0], key)
        return out

    def _reading(self, key: str, state: str, now: float, out: dict[str, Any]) -> None:
        self._last[key] = state
        if state in ACTIVE and not self._tracks:
            self._noisy.add(key)
        if state == "firing":
            self._fired.add(key)
        for t in self._tracks:
            if t.alert == key:
                t.read(now, state)
        shown = "resolved" if state == "inactive" and key in self._fired else state
        out.update({f"state.{key}": shown, f"firing.{key}": int(state == "firing"),
                    f"pending.{key}": int(state == "pending")})

    def missing(self, key: str, values: dict[str, Any]) -> str:
        if values.get("source_up") == 0:
            return f"not measured: the alert source is unreachable ({values.get('source_error')})"
        return "not measured yet (no fault window has reached it)" if key.startswith(("detect_s", "resolve_s")) \
            else "not measured"

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None
