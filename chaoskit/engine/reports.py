"""Write what a run found: the final JSON summary, JUnit XML for CI, and a self-contained HTML report."""

from __future__ import annotations

import html
import json
import time
from pathlib import Path
from typing import Any
from xml.etree import ElementTree as ET

from chaoskit.engine.runner import RunResult
from chaoskit.spec.models import Experiment


def summary(result: RunResult, exp: Experiment) -> dict[str, Any]:
    st = result.status
    return {
        "run_id": result.run_id,
        "experiment": exp.metadata.name,
        "description": exp.metadata.description,
        "status": st.state.value,
        "verdict": st.verdict,
        "exit_code": st.exit_code(),
        "deviated": st.deviated,
        "deviations": st.deviations,
        "reason": st.reason,
        "rollback_complete": not st.rollback_incomplete,
        "started": result.started,
        "ended": result.ended,
        "duration_s": round(result.ended - result.started, 3),
        "recovery_s": result.recovery_s,
        "ledger": result.ledger_path,
        "states": [{"state": s, "t": t} for s, t in st.history],
        "plan": result.plan,
        "faults": result.faults,
        "samples": [s.to_json() for s in result.samples],
    }


def write_summary(path: Path, data: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2, default=str))


def write_junit(path: Path, data: dict[str, Any]) -> None:
    """One testcase per (phase, probe), plus one for rollback and one for safeguards."""
    cases: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for s in data["samples"]:
        cases.setdefault((s["phase"], s["probe"]), []).append(s)
    suite = ET.Element("testsuite", name=f"chaoskit.{data['experiment']}", timestamp=time.strftime(
        "%Y-%m-%dT%H:%M:%S", time.localtime(data["started"])), time=f"{data['duration_s']:.3f}")
    failures = errors = 0

    def case(name: str, classname: str, seconds: float = 0.0) -> ET.Element:
        return ET.SubElement(suite, "testcase", name=name, classname=classname, time=f"{seconds:.3f}")

    for (phase, probe), samples in cases.items():
        tc = case(f"{phase}: {probe}", f"chaoskit.{data['experiment']}.{phase}",
                  sum(s["duration_ms"] for s in samples) / 1000)
        bad = [s for s in samples if s["verdict"] != "ok"]
        if bad:
            failures += 1
            first = bad[0]
            msg = first["error"] or "; ".join(first["details"])
            el = ET.SubElement(tc, "failure", message=f"{len(bad)}/{len(samples)} samples did not hold: {msg}")
            el.text = "\n".join(f"{s['t']:.3f} {s['verdict']}: {s['error'] or '; '.join(s['details'])}"
                                for s in bad)
    tc = case("rollback", f"chaoskit.{data['experiment']}")
    if not data["rollback_complete"]:
        errors += 1
        ET.SubElement(tc, "error", message=f"rollback incomplete: {data['reason']}")
    tc = case("safeguards", f"chaoskit.{data['experiment']}")
    if data["status"] == "aborted":
        failures += 1
        ET.SubElement(tc, "failure", message=data["reason"])
    if data["status"] == "failed":
        errors += 1
        ET.SubElement(case("run", f"chaoskit.{data['experiment']}"), "error", message=data["reason"])
    suite.set("tests", str(len(suite)))
    suite.set("failures", str(failures))
    suite.set("errors", str(errors))
    path.parent.mkdir(parents=True, exist_ok=True)
    ET.ElementTree(suite).write(path, encoding="utf-8", xml_declaration=True)


def write_html(path: Path, data: dict[str, Any]) -> None:
    e = html.escape
    colour = {"held": "#1a7f37", "deviated": "#b35900"}.get(data["verdict"], "#c62828")
    t0 = data["started"]
    rows = "".join(
        f"<tr class='{e(s['verdict'])}'><td>{s['t'] - t0:.2f}s</td><td>{e(s['phase'])}</td><td>{e(s['probe'])}</td>"
        f"<td>{e(s['verdict'])}</td><td>{e(s['error'] or '; '.join(s['details']))}</td></tr>"
        for s in data["samples"])
    faults = "".join(
        f"<tr><td>#{f['id']}</td><td>{e(f['step'])}</td><td>{e(f['type'])}</td>"
        f"<td>{_rel(f['applied_at'], t0)}</td><td>{_rel(f['reverted_at'], t0)}</td><td>{f['apply_ms']}</td></tr>"
        for f in data["faults"])
    states = " → ".join(f"{e(s['state'])} ({s['t'] - t0:.2f}s)" for s in data["states"])
    plan = "".join(f"<li><b>{e(p['step'])}</b>: {e('; '.join(p['changes']))}</li>" for p in data["plan"])
    doc = f"""<!doctype html><html><head><meta charset="utf-8"><title>chaoskit: {e(data['experiment'])}</title>
<style>body{{font-family:system-ui,sans-serif;margin:2em;max-width:1100px}}table{{border-collapse:collapse;width:100%}}
td,th{{border:1px solid #ddd;padding:4px 8px;font-size:14px;text-align:left}}tr.fail td,tr.error td{{background:#fdecea}}
.v{{color:#fff;background:{colour};padding:4px 10px;border-radius:4px}}</style></head><body>
<h1>{e(data['experiment'])} <span class="v">{e(data['verdict'])}</span></h1>
<p>{e(data['description'])}</p>
<p>run <code>{e(data['run_id'])}</code> · exit code {data['exit_code']} · {data['duration_s']:.2f}s ·
recovery {data['recovery_s'] if data['recovery_s'] is not None else 'n/a'}s ·
rollback {'complete' if data['rollback_complete'] else '<b>INCOMPLETE</b>'}</p>
<p>{e(data['reason'])}</p><ul>{''.join(f'<li>{e(d)}</li>' for d in data['deviations'])}</ul>
<h2>States</h2><p>{states}</p><h2>Plan</h2><ul>{plan}</ul>
<h2>Faults</h2><table><tr><th>#</th><th>step</th><th>type</th><th>applied</th><th>reverted</th><th>apply ms</th></tr>
{faults}</table>
<h2>Probe samples</h2><table><tr><th>t</th><th>phase</th><th>probe</th><th>verdict</th><th>details</th></tr>{rows}</table>
</body></html>"""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(doc, encoding="utf-8")


def _rel(t: float | None, t0: float) -> str:
    return f"{t - t0:.2f}s" if t else "—"
