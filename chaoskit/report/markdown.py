"""Markdown summaries for a CI job summary or a pull-request comment: one run (from its journal events, like
the HTML report) or a suite (one row per experiment)."""

from __future__ import annotations

from chaoskit.report.view import RunView, SuiteRow, counted, phase_table

ICON = {"held": "✅", "deviated": "❌", "planned": "📝"}
OUTCOME_MARK = {"ok": "✅", "fail": "❌", "unjudged": "⚪", "undecided": "⏳"}


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _rel(view: RunView, t: float | None) -> str:
    return f"+{t - view.started:.2f}s" if t else "—"


def render(view: RunView, report_path: str | None = None) -> str:
    icon = ICON.get(view.verdict, "⛔")
    duration = view.ended - view.started if view.started else 0.0
    lines = [f"### {icon} {view.experiment}: {view.verdict} (exit {view.exit_code})", ""]
    if view.description:
        lines += [view.description, ""]
    recovery = f"{view.recovery_s:g}s after rollback" if view.recovery_s is not None else "n/a"
    lines += [f"run `{view.run_id}` · {duration:.1f}s · recovery {recovery} · rollback "
              + ("complete" if view.rollback_complete else "**INCOMPLETE**"), ""]
    if not view.complete:
        lines += ["**The journal ends before the run did** (killed?).", ""]
    if view.reason:
        lines += [f"> {_cell(view.reason)}", ""]
    for d in view.deviations:
        lines.append(f"- deviation: {_cell(d)}")
    if view.deviations:
        lines.append("")
    phases, table = phase_table(view)
    if table:
        lines += ["| probe | " + " | ".join(phases) + " |", "|---" * (len(phases) + 1) + "|"]
        for probe in view.probes():
            cells = []
            for p in phases:
                n, bad = table.get(probe, {}).get(p, (0, 0))
                outcome = view.phase_outcome(probe, p)  # the engine's judgement of the phase, not the count's
                cells.append("" if not n else f"{OUTCOME_MARK[outcome]} {counted(n, bad, outcome)}")
            lines.append(f"| {_cell(probe)} | " + " | ".join(cells) + " |")
        lines.append("")
    if view.faults:
        lines += ["| fault | type | applied | reverted |", "|---|---|---|---|"]
        for f in view.faults:
            rev = _rel(view, f.reverted_at) + (f" **revert failed: {_cell(f.revert_error)}**" if f.revert_error
                                                else "")
            lines.append(f"| #{f.id} {_cell(f.step)} | `{f.type}` | {_rel(view, f.applied_at)} | {rev} |")
        lines.append("")
        exits = [f"- fault #{f.id} {_cell(f.step)}: {_cell(e.text)}, seen {_rel(view, e.seen_at)}"
                 for f in view.faults for e in f.exits]
        lines += [*exits, ""] if exits else []
    lines += _detection(view)
    if report_path:
        lines += [report_line(report_path), ""]
    return "\n".join(lines)


def _seconds(value: float | None) -> str:
    return "—" if value is None else f"{value:g}s"


def _detection(view: RunView) -> list[str]:
    """The alert probes' time to detect and to resolve each fault (MTTD/MTTR) and the noisy rules."""
    found = view.detection()
    if not found.outcomes and not found.noisy:
        return []
    lines = [f"**MTTD {_seconds(found.mttd_s)} · MTTR {_seconds(found.mttr_s)}** (alert probes: apply → first sample "
             "firing, revert → first sample gone)", ""]
    if found.outcomes:
        lines += ["| fault | alert | time to detect | time to resolve |", "|---|---|---|---|"]
        for o in found.outcomes:
            lines.append(f"| #{o.fault} {_cell(o.step)} | {_cell(o.alert)} ({_cell(o.probe)}) "
                         f"| {o.detected} {'' if o.detected == 'already firing' else _seconds(o.detect_s)} "
                         f"(≤ {o.detect_within:g}s) "
                         f"| {o.resolved} {_seconds(o.resolve_s)} (≤ {o.resolve_within:g}s) |")
        lines.append("")
    lines += [f"- noisy rule: {_cell(n.alert)} ({_cell(n.probe)}) was {n.state} at {_rel(view, n.t)}, before any "
              "fault" for n in found.noisy]
    return [*lines, ""] if found.noisy else lines


def report_line(path: str) -> str:
    """Where the HTML report is, as a path relative to the summary that names it (never a runner's absolute
    path: the Markdown is read in a CI job summary or beside the files)."""
    return f"Report: `{path}`"


def render_suite(title: str, rows: list[SuiteRow], code: int, index: str | None = None) -> str:
    worst = "✅" if code == 0 else "❌"
    lines = [f"### {worst} {title}: exit {code}", "", "| experiment | verdict | exit | duration | why |",
             "|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {_cell(r.experiment)} | {ICON.get(r.verdict, '⛔')} {r.verdict} "
                     f"| {'-' if r.exit_code is None else r.exit_code} | {r.duration_s:.1f}s | {_cell(r.why())[:300]} |")
    lines.append("")
    if index:
        lines += [f"Reports: `{index}`", ""]
    return "\n".join(lines)
