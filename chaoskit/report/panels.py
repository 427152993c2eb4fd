"""What a report's charts show of a RunView: per probe the panels (which measurements, the thresholds the engine
judged them against, each measurement marked as the engine judged it: nothing is judged here), the verdict lane,
the fault and phase windows, the moments."""

from __future__ import annotations

import math
import re
from typing import Any

from chaoskit.model.enums import Verdict
from chaoskit.model.events import RuleRecord, Sample
from chaoskit.model.tolerance import Tolerance
from chaoskit.report.charts import Line, Mark, Moment, Panel, Series, Window
from chaoskit.report.view import RunView

PHASE_LABEL = {"hypothesis_before": "before", "method": "method", "rollback": "rollback",
               "hypothesis_after": "after", "preflight": "preflight"}
ALL_PCT, OK_PCT = "percentiles (ms, all requests)", "percentiles (ms)"  # all_p99_ms ...; p99_ms ... (successes only)
HEADLINE = (ALL_PCT, OK_PCT, "error_rate", "goodput_rps", "latency_ms", "value", "rate", "count",
            "memory_used_share", "exit_code", "duration_ms")
MAX_EXTRA_PANELS = 24
_PCT = re.compile(r"^(?P<all>all_)?(?P<prefix>(?:[a-z]+_)?)p(?:50|90|99|999)_(?P<unit>ms|us)$")
SUCCESSES_ONLY = ", successes only"  # the title of a successes-only percentile panel beside an all-requests one
_GROUP = re.compile(r"^(?P<key>[^\[\]]+)\[(?P<group>[^\[\]]+)\]$")


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
    """Keys drawn in one panel: p50/p90/p99/p999 of one kind together (all_p99_ms, the all-requests view, apart
    from p99_ms, the successes-only one), each group_by key across its groups."""
    if m := _GROUP.match(key):
        return f"{m.group('key')} by group"
    if m := _PCT.match(key):
        return f"{m.group('prefix')}percentiles ({m.group('unit')}{', all requests' if m.group('all') else ''})"
    return key


def headline(families: dict[str, list[str]]) -> list[str]:
    """The panels shown without being expected: the all-requests percentiles take the place of the
    successes-only ones (those move to the other panels; a journal without all_* keys still heads with them)."""
    return [f for f in HEADLINE if f in families and not (f == OK_PCT and ALL_PCT in families)]


def panel_title(fam: str, families: dict[str, list[str]]) -> str:
    """A successes-only percentile panel says so when its all-requests counterpart is measured too."""
    if fam.endswith(")") and fam.replace(")", ", all requests)") in families:
        return fam[:-1] + SUCCESSES_ONLY + ")"
    return fam


def fixed_bounds(tol: Tolerance) -> list[tuple[float, str]]:
    """The fixed numbers of a rule, each with how it reads ('< 950'; a range's two): the lines drawn for a key no
    sample has a judgement of (a journal written before judgements were recorded, every sample an error). A
    baseline rule has none: its threshold is what the engine resolved, recorded on each judgement."""
    if tol.kind == "range":
        return [(tol.low, f">= {tol.low:g}"), (tol.high, f"<= {tol.high:g}")]
    if tol.kind in ("cmp", "eq") and isinstance(tol.value, (int, float)) and not isinstance(tol.value, bool):
        return [(float(tol.value), f"{tol.op} {float(tol.value):g}")]
    return []


def judged_bounds(samples: list[Sample], key: str, tol: Tolerance | None) -> list[tuple[float, str]]:
    """The numbers the engine judged `key` against (a baseline resolved: '< 3x baseline = 120'), each once."""
    seen = {b: None for s in samples if (j := s.judgement(key)) is not None for b in j.bounds()}
    return list(seen) if seen else (fixed_bounds(tol) if tol is not None else [])


def panels_for(view: RunView, probe: str) -> tuple[list[Panel], list[Panel]]:
    """(the main panels: what the probe expects and the headline measurements; the other numeric ones)."""
    samples = [s for s in view.samples if s.probe == probe]
    expect = view.expects.get(probe, {})
    keys: dict[str, None] = {}  # numbers only; text counts where a tolerance reads it as one (a header)
    for s in samples:
        for k, val in s.values.items():
            if number(val) is not None and (k in expect or not isinstance(val, str)):
                keys[k] = None
    families: dict[str, list[str]] = {}
    for k in keys:
        families.setdefault(family(k), []).append(k)
    main = [f for f in families if any(k in expect for k in families[f])]
    main += [f for f in headline(families) if f not in main]
    extra = [f for f in families if f not in main][:MAX_EXTRA_PANELS]
    guards = [rule for g in view.safeguards if g.probe == probe for rule in g.rules]
    return ([_panel(view, probe, f, families, samples, expect, guards) for f in main],
            [_panel(view, probe, f, families, samples, expect, guards) for f in extra])


def mark_state(sample: Sample, key: str) -> str:
    """How a chart marks one measurement: as the engine judged it. error (the sample is one), else the outcome
    of the key's judgement (ok for a key it did not judge). A sample written before judgements were recorded:
    its verdict for a key its words judged, ok for the others."""
    if sample.verdict is Verdict.ERROR:
        return "error"
    if sample.judgements is not None:
        judged = sample.judgement(key)
        return judged.outcome if judged is not None else "ok"
    said = any(d.startswith(f"{key}: ") for d in sample.details)
    return sample.verdict.value if said else "ok"


def _panel(view: RunView, probe: str, fam: str, families: dict[str, list[str]], samples: list[Sample],
           expect: dict[str, Tolerance], guards: list[RuleRecord]) -> Panel:
    t0, keys = view.started, families[fam]
    series, lines = [], []
    for key in keys:
        tol = expect.get(key)
        marks = []
        for s in samples:
            value = number(s.values.get(key))
            state = mark_state(s, key)
            if value is None and state != "error":
                continue  # the key was not measured in this sample (and it is no error sample)
            marks.append(Mark(s.t, value, state, s.phase.judged, _title(s, t0, key, value)))
        series.append(Series(probe, key, marks))
        if tol is not None:
            lines += [Line(v, f"{key} {text}" if len(keys) > 1 else text)
                      for v, text in judged_bounds(samples, key, tol)]
    for rule in guards:
        if rule.metric in keys and rule.value is not None:
            lines.append(Line(rule.value, f"abort if {rule.text}", "safeguard"))
    return Panel(panel_title(fam, families), series, lines)


def _title(s: Sample, t0: float, key: str, value: float | None) -> str:
    what = f"{key} = {value:g}" if value is not None else (s.error or "no value")
    judged = s.judgement(key)
    detail = f"{key}: {judged.why}" if judged is not None else next(
        (d for d in s.details if d.startswith(f"{key}: ")), "")
    return (f"+{s.t - t0:.2f}s [{s.phase}] {s.verdict}: {what}" + (f" ({detail})" if detail else "")
            + f", took {s.duration_ms:.0f} ms")


def verdict_marks(view: RunView, probe: str) -> list[Mark]:
    return [Mark(s.t, None, s.verdict, s.phase.judged, f"+{s.t - view.started:.2f}s [{s.phase}] {s.verdict}: {s.why()}")
            for s in view.samples if s.probe == probe]


def fault_windows(view: RunView) -> list[Window]:
    out = []
    for f in view.faults:
        if f.applied_at is None:
            continue
        end = f.reverted_at or view.ended
        plan = next((p for p in view.plan if p.step == f.step), None)
        title = (f"#{f.id} {f.step} ({f.type}) applied +{f.applied_at - view.started:.2f}s, "
                 + (f"reverted +{f.reverted_at - view.started:.2f}s" if f.reverted_at else "not reverted")
                 + "".join(f"\n{c}" for c in (plan.changes if plan else [])))
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
        out += [Moment(e.seen_at, f"PID {e.pid} exited", e.event) for e in f.exits]
    return out
