"""What a report shows, rebuilt from a run's journal events alone, so `chaoskit report JOURNAL` gives the report
the run wrote: the outcome, the phases, each fault with its apply/revert times and what observe() saw, every
sample, the tolerances and safeguard rules, the host facts and the experiment after substitution; and per probe
the chart panels (which measurements, their tolerance lines, which samples deviated)."""

from __future__ import annotations

import math
import operator
import re
from dataclasses import dataclass, field
from typing import Any

from chaoskit.engine.charts import Line, Mark, Moment, Panel, Series, Window
from chaoskit.engine.target_exits import EVENT as TARGET_EXITED
from chaoskit.engine.target_exits import TargetExit

JUDGED = ("before", "during", "after")  # samples of other phases (grace, between, safeguard) are drawn, not judged
PHASE_LABEL = {"hypothesis_before": "before", "method": "method", "rollback": "rollback",
               "hypothesis_after": "after", "preflight": "preflight"}
HEADLINE = ("percentiles (ms)", "error_rate", "goodput_rps", "latency_ms", "value", "rate", "count",
            "memory_used_share", "exit_code", "duration_ms")
MAX_EXTRA_PANELS = 24
NOTE_EVENTS = ("safeguard", "interrupt", "error", "watchdog_died", "revert_failed", "late_apply_reverted", "operator")
_OPS = {"<": operator.lt, "<=": operator.le, ">": operator.gt, ">=": operator.ge, "==": operator.eq,
        "!=": operator.ne}
_PCT = re.compile(r"^(?P<prefix>(?:[a-z]+_)?)p(?:50|90|99|999)_(?P<unit>ms|us)$")
_GROUP = re.compile(r"^(?P<key>[^\[\]]+)\[(?P<group>[^\[\]]+)\]$")


@dataclass
class Fault:
    id: int
    step: str
    type: str
    duration_s: float | None = None
    applied_at: float | None = None
    reverted_at: float | None = None
    apply_ms: float | None = None
    observed: dict[str, Any] = field(default_factory=dict)  # when (applied, before_revert) -> observe() details
    revert_error: str | None = None
    exits: list[TargetExit] = field(default_factory=list)  # target processes that exited while it was in effect


@dataclass
class RunView:
    run_id: str = ""
    experiment: str = ""
    description: str = ""
    file: str = ""
    started: float = 0.0
    ended: float = 0.0
    complete: bool = False  # the journal has the run's end (a killed run's journal has not)
    verdict: str = "unfinished"
    exit_code: int | None = None
    reason: str = ""
    deviations: list[str] = field(default_factory=list)
    recovery_s: float | None = None
    recovered_at: float | None = None
    states: list[tuple[str, float]] = field(default_factory=list)
    plan: list[dict[str, Any]] = field(default_factory=list)
    faults: list[Fault] = field(default_factory=list)
    samples: list[dict[str, Any]] = field(default_factory=list)
    expects: dict[str, dict[str, dict[str, Any]]] = field(default_factory=dict)  # probe -> key -> tolerance
    safeguards: list[dict[str, Any]] = field(default_factory=list)
    host: dict[str, Any] = field(default_factory=dict)
    document: Any = None
    variables: dict[str, Any] = field(default_factory=dict)
    notes: list[tuple[float, str, str]] = field(default_factory=list)  # (t, event, text)

    @property
    def rollback_complete(self) -> bool:
        return self.exit_code != 5 and not any(f.revert_error for f in self.faults)

    def probes(self) -> list[str]:
        """Probe names in the order of the experiment, then any others that were sampled."""
        names = list(self.expects)
        names += [s["probe"] for s in self.samples if s["probe"] not in names]
        return list(dict.fromkeys(n for n in names if any(s["probe"] == n for s in self.samples)))


def last_run(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A journal appended to by several runs (the same --journal twice): the events of the last one, with the
    experiment and host records written just before it."""
    runs = [i for i, ev in enumerate(events) if ev.get("event") == "run"]
    if not runs:
        return events
    start = runs[-1]
    while start > 0 and events[start - 1].get("event") in ("experiment", "host"):
        start -= 1
    return events[start:]


def run_view(events: list[dict[str, Any]]) -> RunView:
    v = RunView()
    faults: dict[int, Fault] = {}
    for ev in last_run(events):
        kind, t = ev.get("event"), float(ev.get("t", 0.0))
        if kind == "experiment":
            v.file, v.document, v.variables = ev.get("file", ""), ev.get("document"), ev.get("vars") or {}
            v.expects, v.safeguards = ev.get("expect") or {}, ev.get("safeguards") or []
            v.description = ev.get("description", "")
        elif kind == "host":
            v.host = {k: x for k, x in ev.items() if k not in ("t", "event")}
        elif kind == "run":
            v.run_id, v.experiment, v.started = ev.get("run_id", ""), ev.get("experiment", ""), t
            v.states = [("pending", t)]
        elif kind == "state":
            v.states.append((ev["state"], t))
        elif kind == "plan":
            v.plan = ev.get("steps") or []
        elif kind == "sample":
            v.samples.append(ev)
        elif kind == "fault_applied":
            faults[ev["id"]] = Fault(ev["id"], ev.get("step", ""), ev.get("type", ""), ev.get("duration_s"),
                                     ev.get("applied_at") or t, None, ev.get("apply_ms"))
        elif kind == "fault_observed" and ev.get("id") in faults:
            faults[ev["id"]].observed[ev.get("when", "?")] = ev.get("details")
        elif kind == "fault_reverted" and ev.get("id") in faults:
            faults[ev["id"]].reverted_at = t
        elif kind == TARGET_EXITED and ev.get("id") in faults:
            _note_exit(v, faults[ev["id"]], TargetExit.from_event(ev), t)
        elif kind == "recovered":
            v.recovered_at, v.recovery_s = t, ev.get("seconds")
        elif kind == "end":
            v.complete, v.ended = True, t
            v.verdict, v.exit_code = ev.get("verdict", "unfinished"), ev.get("exit_code")
            v.reason, v.deviations = ev.get("reason") or "", ev.get("deviations") or []
            v.recovery_s = ev.get("recovery_s", v.recovery_s)
        if kind == "revert_failed" and ev.get("id") in faults:
            faults[ev["id"]].revert_error = ev.get("error") or "revert failed"
        if kind in NOTE_EVENTS:
            v.notes.append((t, kind, ", ".join(f"{k}={x}" for k, x in ev.items()
                                               if k not in ("t", "event", "traceback"))))
        v.ended = max(v.ended, t) if not v.complete else v.ended
    v.faults = sorted(faults.values(), key=lambda f: f.id)
    if not v.experiment and v.document:
        v.experiment = str((v.document.get("metadata") or {}).get("name", ""))
    return v


def _note_exit(v: RunView, fault: Fault, exit_: TargetExit, t: float) -> None:
    """A target that exited during its fault: on the fault, and among the run's events."""
    fault.exits.append(exit_)
    v.notes.append((t, TARGET_EXITED, f"fault #{fault.id} {fault.step} ({fault.type}): {exit_.text()}"))


# -- what the charts show -------------------------------------------------------------------------------------
def number(value: Any) -> float | None:
    """A finite number, or None (booleans and text are no numbers; numeric text such as a header value is)."""
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, str):
        try:
            value = float(value.strip())
        except ValueError:
            return None
    if isinstance(value, (int, float)) and math.isfinite(float(value)):
        return float(value)
    return None


def family(key: str) -> str:
    """Keys drawn in one panel: p50/p90/p99/p999 of one kind together, each group_by key across its groups."""
    if m := _GROUP.match(key):
        return f"{m.group('key')} by group"
    if m := _PCT.match(key):
        return f"{m.group('prefix')}percentiles ({m.group('unit')})"
    return key


def baseline_of(view: RunView, probe: str, key: str) -> float | None:
    for s in view.samples:
        if s["probe"] == probe and s["phase"] == "before":
            return number((s.get("values") or {}).get(key))
    return None


def thresholds(tol: dict[str, Any], baseline: float | None) -> list[tuple[float, str]]:
    """The numbers a tolerance compares with, each with how it reads ('< 950', '<= 3x baseline = 361.5')."""
    kind = tol.get("kind")
    if kind == "range":
        return [(tol["low"], f">= {tol['low']:g}"), (tol["high"], f"<= {tol['high']:g}")]
    if kind == "baseline" and baseline is not None:
        value = tol["scale"] * baseline + tol["offset"]
        return [(value, f"{tol['op']} {tol['expr']} = {value:g}")]
    if kind in ("cmp", "eq") and number(tol.get("value")) is not None and not isinstance(tol.get("value"), str):
        return [(float(tol["value"]), f"{tol.get('op', '==')} {float(tol['value']):g}")]
    return []


def holds(tol: dict[str, Any], value: float, baseline: float | None) -> bool | None:
    """Whether a number meets a tolerance (None: cannot tell from the journal, e.g. a regex)."""
    kind = tol.get("kind")
    if kind == "range":
        return tol["low"] <= value <= tol["high"]
    lines = thresholds(tol, baseline)
    if not lines or tol.get("op") not in _OPS:
        return None
    return bool(_OPS[tol["op"]](value, lines[0][0]))


def panels_for(view: RunView, probe: str) -> tuple[list[Panel], list[Panel]]:
    """(the main panels: what the probe expects and the headline measurements; the other numeric ones)."""
    samples = [s for s in view.samples if s["probe"] == probe]
    expect = view.expects.get(probe, {})
    keys: dict[str, None] = {}  # numbers only; text counts where a tolerance reads it as one (a header)
    for s in samples:
        for k, val in (s.get("values") or {}).items():
            if number(val) is not None and (k in expect or not isinstance(val, str)):
                keys[k] = None
    families: dict[str, list[str]] = {}
    for k in keys:
        families.setdefault(family(k), []).append(k)
    main = [f for f in families if any(k in expect for k in families[f])]
    main += [f for f in HEADLINE if f in families and f not in main]
    extra = [f for f in families if f not in main][:MAX_EXTRA_PANELS]
    guards = [(rule, g) for g in view.safeguards if g.get("probe") == probe for rule in g.get("rules", [])]
    return ([_panel(view, probe, f, families[f], samples, expect, guards) for f in main],
            [_panel(view, probe, f, families[f], samples, expect, guards) for f in extra])


def _panel(view: RunView, probe: str, fam: str, keys: list[str], samples: list[dict[str, Any]],
           expect: dict[str, dict[str, Any]], guards: list[tuple[dict[str, Any], dict[str, Any]]]) -> Panel:
    t0 = view.started
    series, lines = [], []
    for key in keys:
        tol, base = expect.get(key), baseline_of(view, probe, key)
        marks = []
        for s in samples:
            value = number((s.get("values") or {}).get(key))
            ok = holds(tol, value, base) if tol is not None and value is not None else None
            if s["verdict"] == "error":
                state = "error"
            elif ok is None:  # no tolerance on this key, or none to recompute: the detail says
                state = "fail" if s["verdict"] == "fail" and _detail_failed(s, key) else "ok"
            else:
                state = "ok" if ok else "fail"
            if value is None and state != "error":
                continue  # the key was not measured in this sample (and it is no error sample)
            marks.append(Mark(s["t"], value, state, s["phase"] in JUDGED, _title(s, t0, key, value)))
        series.append(Series(probe, key, marks))
        if tol is not None:
            lines += [Line(v, f"{key} {text}" if len(keys) > 1 else text) for v, text in thresholds(tol, base)]
    for rule, _g in guards:
        if rule.get("metric") in keys and number(rule.get("value")) is not None:
            lines.append(Line(float(rule["value"]), f"abort if {rule['text']}", "safeguard"))
    title = fam if len(keys) > 1 or fam != keys[0] else keys[0]
    return Panel(title, series, lines)


def _detail_failed(sample: dict[str, Any], key: str) -> bool:
    for d in sample.get("details") or []:
        if d.startswith(f"{key}: "):
            return any(w in d for w in ("is false", "not in", "does not match", "!=", "not a number",
                                        "no baseline", "not measured"))
    return False


def _title(s: dict[str, Any], t0: float, key: str, value: float | None) -> str:
    what = f"{key} = {value:g}" if value is not None else (s.get("error") or "no value")
    detail = next((d for d in s.get("details") or [] if d.startswith(f"{key}: ")), "")
    return (f"+{s['t'] - t0:.2f}s [{s['phase']}] {s['verdict']}: {what}" + (f" ({detail})" if detail else "")
            + f", took {s.get('duration_ms', 0):.0f} ms")


def verdict_marks(view: RunView, probe: str) -> list[Mark]:
    out = []
    for s in view.samples:
        if s["probe"] != probe:
            continue
        why = s.get("error") or "; ".join(s.get("details") or [])
        out.append(Mark(s["t"], None, s["verdict"], s["phase"] in JUDGED,
                        f"+{s['t'] - view.started:.2f}s [{s['phase']}] {s['verdict']}: {why}"))
    return out


def fault_windows(view: RunView) -> list[Window]:
    out = []
    for f in view.faults:
        if f.applied_at is None:
            continue
        end = f.reverted_at or view.ended
        plan = next((p for p in view.plan if p.get("step") == f.step), {})
        title = (f"#{f.id} {f.step} ({f.type}) applied +{f.applied_at - view.started:.2f}s, "
                 + (f"reverted +{f.reverted_at - view.started:.2f}s" if f.reverted_at else "not reverted")
                 + "".join(f"\n{c}" for c in plan.get("changes", [])))
        out.append(Window(f.applied_at, end, f"#{f.id} {f.step}", "fault", title, str(f.id)))
    return out


def phase_windows(view: RunView) -> list[Window]:
    out = []
    for (state, t), nxt in zip(view.states, [*view.states[1:], (None, view.ended)], strict=True):
        if state in PHASE_LABEL and nxt[1] > t:
            out.append(Window(t, nxt[1], PHASE_LABEL[state], state, f"{state} +{t - view.started:.2f}s "
                              f"for {nxt[1] - t:.2f}s"))
    return out


def moments(view: RunView) -> list[Moment]:
    out = []
    if view.recovered_at is not None:
        out.append(Moment(view.recovered_at, f"recovered {view.recovery_s or 0:g}s", "recovered"))
    for t, kind, _ in view.notes:
        if kind in ("safeguard", "interrupt"):
            out.append(Moment(t, "safeguard tripped" if kind == "safeguard" else "interrupted", kind))
    for f in view.faults:
        out += [Moment(e.seen_at, f"PID {e.pid} exited", TARGET_EXITED) for e in f.exits]
    return out


def phase_table(view: RunView) -> tuple[list[str], dict[str, dict[str, tuple[int, int]]]]:
    """(the phases sampled, in run order; probe -> phase -> (samples, failed))."""
    order = ["before", "during", "grace", "between", "safeguard", "after"]
    phases = [p for p in order if any(s["phase"] == p for s in view.samples)]
    phases += sorted({s["phase"] for s in view.samples} - set(phases))
    table: dict[str, dict[str, tuple[int, int]]] = {}
    for s in view.samples:
        n, bad = table.setdefault(s["probe"], {}).get(s["phase"], (0, 0))
        table[s["probe"]][s["phase"]] = (n + 1, bad + (s["verdict"] != "ok"))
    return phases, table
