"""The HTML report of one run: one self-contained file (inline CSS and SVG, no script, nothing fetched), built
from the run's journal events only — the same report whether the run writes it or `chaoskit report` rebuilds
it later. Also the index page of a suite, linking each experiment's report."""

from __future__ import annotations

import json
from html import escape
from pathlib import Path
from typing import Any

import yaml

from chaoskit.model.faults import AppliedFault
from chaoskit.report.charts import Layout, timeline_svg
from chaoskit.report.detection import AlertOutcome, Detection
from chaoskit.report.panels import fault_windows, moments, panels_for, phase_windows, verdict_marks
from chaoskit.report.view import RunView, SuiteRow, counted, phase_table

VERDICT_COLOUR = {"held": "#1a7f37", "deviated": "#b35900", "planned": "#1f6feb"}
CSS = """
*{box-sizing:border-box}
body{font-family:system-ui,-apple-system,"Segoe UI",sans-serif;margin:1.5em auto;max-width:1180px;padding:0 1em;
color:#1f2328}
h1{margin-bottom:.2em}h2{border-bottom:1px solid #d0d7de;padding-bottom:.2em;margin-top:1.6em}
table{border-collapse:collapse;width:100%;margin:.5em 0}
td,th{border:1px solid #d0d7de;padding:4px 8px;font-size:13px;text-align:left;vertical-align:top}
th{background:#f6f8fa}tr.fail td,tr.error td{background:#fdecea}
td.ok{background:#e6f4ea}td.bad{background:#fdecea;font-weight:bold}td.unjudged{color:#57606a}
.v{color:#fff;padding:3px 10px;border-radius:4px;font-size:.7em;vertical-align:middle}
.facts span{margin-right:1.2em;white-space:nowrap}.facts span:last-child{white-space:normal;overflow-wrap:anywhere}code,pre{font-size:12px}
pre{background:#f6f8fa;padding:.8em;overflow:auto;border:1px solid #d0d7de}
.probe{margin:1em 0 2em}.legend{font-size:12px;color:#57606a}.chart{overflow-x:auto}
.obs{max-width:380px;word-break:break-all;font-family:monospace;font-size:12px}
"""
LEGEND = ("Samples sit at their start time. Shaded orange: a fault in effect (hover for its plan). Dashed grey: "
          "a tolerance; dashed red: a safeguard's abort rule. Filled red: a judged sample (before, during, after) "
          "that failed; ✕: no value (an error sample); hollow: a sample taken between faults or in the grace "
          "after an apply, recorded but not judged.")


def _t(view: RunView, t: float | None) -> str:
    return f"+{t - view.started:.2f}s" if t else "—"


def render(view: RunView) -> str:
    e = escape
    colour = VERDICT_COLOUR.get(view.verdict, "#c62828")
    duration = view.ended - view.started if view.started else 0.0
    recovery = (f"{view.recovery_s:g}s after rollback" if view.recovery_s is not None
                else ("did not recover" if any(s == "hypothesis_after" for s, _ in view.states) else "n/a"))
    facts = [("run", f"<code>{e(view.run_id)}</code>"), ("exit code", e(str(view.exit_code))),
             ("duration", f"{duration:.2f}s"), ("recovery", e(recovery)),
             ("rollback", "complete" if view.rollback_complete else "<b>INCOMPLETE</b>"),
             ("file", f"<code>{e(view.file)}</code>")]
    parts = [f"""<!doctype html><html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width,initial-scale=1">
<title>chaoskit: {e(view.experiment)} {e(view.verdict)}</title><style>{CSS}</style></head><body>
<h1>{e(view.experiment)} <span class="v" style="background:{colour}">{e(view.verdict)}</span></h1>
<p>{e(view.description)}</p>
<p class="facts">{" ".join(f"<span>{k}: {v}</span>" for k, v in facts)}</p>"""]
    if not view.complete:
        parts.append("<p><b>The journal ends before the run did</b> (killed?): this is what it recorded.</p>")
    if view.reason:
        parts.append(f"<p>{e(view.reason)}</p>")
    if view.deviations:
        parts.append("<ul class='deviations'>" + "".join(f"<li>{e(d)}</li>" for d in view.deviations) + "</ul>")
    parts += [_timelines(view), _verdicts(view), _faults(view), _states(view), _notes(view), _host(view),
              _experiment(view), "<footer><p class='legend'>chaoskit report; rebuild it with <code>chaoskit report "
              "JOURNAL</code></p></footer></body></html>\n"]
    return "\n".join(p for p in parts if p)


def _probe_types(view: RunView) -> dict[str, str]:
    doc = view.document if isinstance(view.document, dict) else {}
    probes = list((doc.get("steadyState") or {}).get("probes") or [])
    probes += [g.get("probe") for g in doc.get("safeguards") or [] if isinstance(g, dict)
               and isinstance(g.get("probe"), dict)]
    return {p["name"]: str(p.get("type", "")) for p in probes if isinstance(p, dict) and "name" in p}


def _timelines(view: RunView) -> str:
    if not view.samples:
        return "<h2>Timelines</h2><p>No probe was sampled.</p>"
    t0, t1 = view.started, max(view.ended, view.started + 1e-3)
    faults, phases, marks = fault_windows(view), phase_windows(view), moments(view)
    types = _probe_types(view)
    out = [f"<h2>Timelines</h2><p class='legend'>{escape(LEGEND)}</p>"]
    for probe in view.probes():
        main, extra = panels_for(view, probe)
        kind = f" <small>({escape(types[probe])})</small>" if types.get(probe) else ""
        out.append(f"<div class='probe' id='probe-{escape(probe)}'><h3>{escape(probe)}{kind}</h3><div class='chart'>"
                   + timeline_svg(probe, t0, t1, main, verdict_marks(view, probe), faults, phases, marks)
                   + "</div>")
        if extra:
            out.append(f"<details><summary>{len(extra)} more measurements of {escape(probe)}</summary>"
                       "<div class='chart'>" + timeline_svg(probe, t0, t1, extra, [], faults, phases, marks,
                                                            Layout(panel_h=64))
                       + "</div></details>")
        out.append("</div>")
    return "".join(out)


def _verdicts(view: RunView) -> str:
    phases, table = phase_table(view)
    if not table:
        return ""
    head = "".join(f"<th>{escape(p)}</th>" for p in phases)
    rows = []
    for probe in view.probes():
        cells = []
        for p in phases:
            n, bad = table.get(probe, {}).get(p, (0, 0))
            outcome = view.phase_outcome(probe, p)  # the engine's judgement of the phase, not the count's
            css = "" if not n else {"unjudged": "unjudged", "fail": "bad", "ok": "ok"}.get(outcome, "")
            text = "" if not n else counted(n, bad, outcome)
            cells.append(f"<td class='{css}'>{text}{' (not judged)' if n and outcome == 'unjudged' else ''}</td>")
        rows.append(f"<tr><td>{escape(probe)}</td>{''.join(cells)}</tr>")
    return (f"<h2>Verdicts per phase</h2><table class='verdicts'><tr><th>probe</th>{head}</tr>{''.join(rows)}</table>"
            "<p class='legend'>grace: within steadyState.during.grace of an apply; between: no fault in effect; "
            "safeguard: samples taken only for a safeguard.</p>")


def _json(value: Any) -> str:
    text = json.dumps(value, default=str, sort_keys=True)
    return escape(text if len(text) <= 600 else text[:600] + " …")


def _faults(view: RunView) -> str:
    if not view.plan and not view.faults:
        return ""
    found = view.detection()
    alerts = bool(found.outcomes)
    rows = []
    for f in view.faults:
        held = (f.reverted_at or view.ended) - f.applied_at if f.applied_at else None
        plan = next((p for p in view.plan if p.step == f.step), None)
        rows.append(
            f"<tr class='{'fail' if f.revert_error else ''}'><td>#{f.id}</td><td>{escape(f.step)}</td>"
            f"<td>{escape(f.type)}</td><td>{_t(view, f.applied_at)}</td><td>{_t(view, f.reverted_at)}"
            + (f"<br><b>revert failed: {escape(f.revert_error)}</b>" if f.revert_error else "")
            + f"</td><td>{f'{held:.2f}s' if held is not None else '—'}</td><td>{escape(str(f.apply_ms)) if f.apply_ms else '—'}</td>"
            f"<td class='exits'>{_exits(view, f)}</td>"
            + (f"<td class='alerts'>{_alert_cell(found.of_fault(f.id))}</td>" if alerts else "")
            +             f"<td class='obs'>{_json(f.observed.get('applied'))}</td>"
            f"<td class='obs'>{_json(f.observed.get('before_revert'))}</td>"
            f"<td>{'<br>'.join(escape(c) for c in (plan.changes if plan else []))}</td></tr>")
    applied = {f.step for f in view.faults}
    for p in view.plan:
        if p.step not in applied:
            rows.append(f"<tr><td>—</td><td>{escape(p.step)}</td><td>{escape(p.type)}</td>"
                        f"<td colspan='{8 if alerts else 7}'>not applied</td>"
                        f"<td>{'<br>'.join(escape(c) for c in p.changes)}</td></tr>")
    return ("<h2>Faults</h2><table class='faults'><tr><th>#</th><th>step</th><th>type</th><th>applied</th>"
            "<th>reverted</th><th>in effect</th><th>apply ms</th><th>targets that exited</th>"
            + ("<th>alerts: time to detect, to resolve</th>" if alerts else "") + "<th>observe() after apply</th>"
            "<th>observe() before revert</th><th>plan</th></tr>" + "".join(rows) + "</table>" + _alerts(view, found))


def _alert_cell(outcomes: list[AlertOutcome]) -> str:
    """Each expected alert against this fault: detected in Xs (≤ limit), resolved in Ys (≤ limit)."""
    bad = ("late", "missed", "not resolved")
    return "<br>".join((f"<b>{escape(o.text())}</b>" if o.detected in bad or o.resolved in bad
                        else escape(o.text())) for o in outcomes) or "—"


def _alerts(view: RunView, found: Detection) -> str:
    """MTTD/MTTR over the faults, and the expected alerts that were active before any fault (noisy rules)."""
    if not found.outcomes and not found.noisy:
        return ""
    seconds = {k: "—" if v is None else f"{v:g}s" for k, v in (("mttd", found.mttd_s), ("mttr", found.mttr_s))}
    noisy = "".join(f"<li><b>noisy rule</b>: {escape(n.alert)} ({escape(n.probe)}) was {escape(n.state)} at "
                    f"{_t(view, n.t)}, before any fault</li>" for n in found.noisy)
    return (f"<p class='detection'>alerts: <b>MTTD {seconds['mttd']}</b> · <b>MTTR {seconds['mttr']}</b> (apply → "
            "the first sample that saw the alert firing; revert → the first that saw it gone: as precise as the "
            "alert probe's sampling interval)</p>" + (f"<ul class='noisy'>{noisy}</ul>" if noisy else ""))


def _exits(view: RunView, f: AppliedFault) -> str:
    """The fault's target processes that exited while it was in effect, each with when it was seen gone."""
    return "<br>".join(f"<b>{escape(e.text)}</b>, seen {_t(view, e.seen_at)}" for e in f.exits) or "—"


def _states(view: RunView) -> str:
    items = " → ".join(f"{escape(s)} ({_t(view, t) if t != view.started else '+0.00s'})" for s, t in view.states)
    return f"<h2>States</h2><p>{items}</p>" if view.states else ""


def _notes(view: RunView) -> str:
    if not view.notes:
        return ""
    rows = "".join(f"<tr><td>{_t(view, t)}</td><td>{escape(k)}</td><td>{escape(text)}</td></tr>"
                   for t, k, text in sorted(view.notes, key=lambda n: n[0]))  # in time order, not as journaled
    return f"<h2>Events</h2><table><tr><th>t</th><th>event</th><th>what</th></tr>{rows}</table>"


def _host(view: RunView) -> str:
    h = view.host
    if h is None:
        return "<h2>Host</h2><p>The journal has no host facts (written by an older chaoskit).</p>"
    mem = f"{h.memory_bytes / 2**30:.1f} GiB" if h.memory_bytes else "?"
    facts = [("host", h.hostname), ("kernel", h.kernel), ("machine", h.machine), ("CPUs", h.cpus), ("memory", mem),
             ("Python", h.python), ("chaoskit", h.chaoskit), ("effective uid", h.euid)]
    rows = "".join(f"<tr><th>{escape(k)}</th><td>{escape(str(v))}</td></tr>" for k, v in facts)
    checks = "".join(f"<tr class='{'' if c.ok else 'fail'}'><td>{escape(c.area)}</td>"
                     f"<td>{'yes' if c.ok else 'no'}</td><td>{escape(c.detail)}</td></tr>" for c in h.doctor)
    skipped = ", ".join(h.doctor_skipped)
    return (f"<h2>Host</h2><table class='host'>{rows}</table><h3>doctor</h3><table class='doctor'><tr><th>capability"
            f"</th><th>ok</th><th>detail</th></tr>{checks}</table><p class='legend'>Not checked during a run (they "
            f"compile or create kernel objects): {escape(skipped)}; run <code>chaoskit doctor</code>.</p>")


def _experiment(view: RunView) -> str:
    if view.document is None:
        return ""
    text = yaml.safe_dump(view.document, sort_keys=False, allow_unicode=True, width=110)
    variables = ", ".join(f"{k}={v}" for k, v in view.variables.items()) or "none"
    return (f"<h2>Experiment as run</h2><p>{escape(view.file)} after includes and substitution; variables: "
            f"<code>{escape(variables)}</code></p><pre class='experiment'>{escape(text)}</pre>")


def render_index(title: str, rows: list[SuiteRow], base: Path) -> str:
    """The suite's index: one row per experiment with its verdict and a link to its report."""
    out = []
    for r in rows:
        colour = VERDICT_COLOUR.get(r.verdict, "#c62828")
        link = r.report
        href = escape(Path(link).resolve().relative_to(base.resolve()).as_posix()
                      if link and Path(link).resolve().is_relative_to(base.resolve()) else (link or ""))
        name = f"<a href='{href}'>{escape(r.experiment)}</a>" if link else escape(r.experiment)
        out.append(f"<tr><td>{name}</td><td><code>{escape(r.file)}</code></td><td><span class='v' "
                   f"style='background:{colour}'>{escape(r.verdict)}</span></td>"
                   f"<td>{'-' if r.exit_code is None else r.exit_code}</td>"
                   f"<td>{r.duration_s:.1f}s</td><td>{escape(r.why())}</td></tr>")
    return (f"<!doctype html><html lang='en'><head><meta charset='utf-8'><title>{escape(title)}</title>"
            f"<style>{CSS}</style></head><body><h1>{escape(title)}</h1><table class='suite'><tr><th>experiment</th>"
            "<th>file</th><th>verdict</th><th>exit</th><th>duration</th><th>why</th></tr>" + "".join(out)
            + "</table></body></html>\n")
