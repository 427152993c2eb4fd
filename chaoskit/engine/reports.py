"""Write what a run found: the final JSON summary, JUnit XML for CI (one testsuite per experiment), the
self-contained HTML report and the Markdown summary (both rebuilt from the journal), and a suite's exit code
and index."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any
from xml.etree import ElementTree as ET

from chaoskit.engine import report_html, report_md
from chaoskit.engine.report_data import run_view
from chaoskit.engine.runner import RunResult
from chaoskit.errors import (
    EXIT_ABORTED,
    EXIT_DEVIATED,
    EXIT_HELD,
    EXIT_INVALID,
    EXIT_PREFLIGHT,
    EXIT_ROLLBACK_INCOMPLETE,
    EXIT_SIGINT,
    EXIT_SIGTERM,
)
from chaoskit.experiment.models import Experiment


def summary(result: RunResult, exp: Experiment, events: list[dict[str, Any]]) -> dict[str, Any]:
    """summary.json: the run's outcome, and its samples as the journal holds them (`events`: the run keeps
    none in memory, so a long run with frequent probes does not grow)."""
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
        "samples": [{k: v for k, v in e.items() if k != "event"} for e in events if e.get("event") == "sample"],
    }


def write_summary(path: Path, data: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2, default=str))


_PHASE_STATES = {"before": ("hypothesis_before",), "during": ("method",), "after": ("hypothesis_after",)}


def phase_seconds(states: list[dict[str, Any]]) -> dict[str, float]:
    """How long each steady-state phase lasted: the time the run spent in its states (the history)."""
    spent: dict[str, float] = {}
    for cur, nxt in zip(states, states[1:], strict=False):
        spent[cur["state"]] = spent.get(cur["state"], 0.0) + nxt["t"] - cur["t"]
    return {phase: sum(spent.get(s, 0.0) for s in names) for phase, names in _PHASE_STATES.items()}


def junit_suite(data: dict[str, Any]) -> ET.Element:
    """One testsuite: a testcase per (phase, probe) lasting the phase, plus one for rollback and one for
    safeguards. Failure lines are stamped with seconds since the run started."""
    cases: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for s in data["samples"]:
        cases.setdefault((s["phase"], s["probe"]), []).append(s)
    suite = ET.Element("testsuite", name=f"chaoskit.{data['experiment']}", timestamp=time.strftime(
        "%Y-%m-%dT%H:%M:%S", time.localtime(data["started"])), time=f"{data['duration_s']:.3f}")
    failures = errors = 0

    def case(name: str, classname: str, seconds: float = 0.0) -> ET.Element:
        return ET.SubElement(suite, "testcase", name=name, classname=classname, time=f"{seconds:.3f}")

    spans = phase_seconds(data["states"])
    for (phase, probe), samples in cases.items():
        tc = case(f"{phase}: {probe}", f"chaoskit.{data['experiment']}.{phase}", spans.get(phase, 0.0))
        # interim: an `over: phase` probe's samples before the one that judges the whole span; not judged alone
        bad = [s for s in samples if s["verdict"] != "ok"] if phase != "interim" else []
        if bad:
            failures += 1
            first = bad[0]
            msg = first["error"] or "; ".join(first["details"])
            el = ET.SubElement(tc, "failure", message=f"{len(bad)}/{len(samples)} samples did not hold: {msg}")
            el.text = "\n".join(f"+{s['t'] - data['started']:.3f}s {s['verdict']}: "
                                f"{s['error'] or '; '.join(s['details'])}" for s in bad)
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
    return suite


def junit_not_run(name: str, file: str, message: str, code: int | None = None) -> ET.Element:
    """The testsuite of an experiment without a summary: an error (invalid file, host cannot do it, interrupted
    while its deployment started: `code`), or skipped (code None: the suite stopped before it)."""
    suite = ET.Element("testsuite", name=f"chaoskit.{name}", tests="1", failures="0",
                       errors="0" if code is None else "1", skipped="1" if code is None else "0", time="0.000")
    tc = ET.SubElement(suite, "testcase", name="run", classname=f"chaoskit.{name}", time="0.000", file=file)
    if code is None:
        ET.SubElement(tc, "skipped", message=message)
    else:
        ET.SubElement(tc, "error", message=f"exit {code}: {message}")
    return suite


def write_junit(path: Path, data: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    ET.ElementTree(junit_suite(data)).write(path, encoding="utf-8", xml_declaration=True)


def write_junit_suites(path: Path, suites: list[ET.Element], name: str = "chaoskit") -> None:
    """A suite's JUnit file: one testsuite per experiment."""
    root = ET.Element("testsuites", name=name)
    for key in ("tests", "failures", "errors", "skipped"):
        root.set(key, str(sum(int(s.get(key, "0")) for s in suites)))
    root.extend(suites)
    path.parent.mkdir(parents=True, exist_ok=True)
    ET.ElementTree(root).write(path, encoding="utf-8", xml_declaration=True)


# -- the report (built from the journal alone) ------------------------------------------------------------
def render_report(events: list[dict[str, Any]], fmt: str = "html", report_path: str | None = None) -> str:
    view = run_view(events)
    return report_html.render(view) if fmt == "html" else report_md.render(view, report_path)


def write_html(path: Path, events: list[dict[str, Any]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(render_report(events), encoding="utf-8")


def write_markdown(path: Path, events: list[dict[str, Any]], report_path: str | None = None) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(render_report(events, "md", report_path), encoding="utf-8")


# -- suites -------------------------------------------------------------------------------------------------
# A suite exits with the worst of its experiments' codes, worst first: faults may still be applied (5), the
# suite was interrupted (143 SIGTERM, 130 SIGINT), a safeguard aborted (3), the hypothesis deviated (1), a
# file is invalid (2), the host cannot run one (4), all held (0). A finding about the system under test outranks
# an experiment that could not run; any other code ranks just below 5.
EXIT_ORDER = (EXIT_ROLLBACK_INCOMPLETE, EXIT_SIGTERM, EXIT_SIGINT, EXIT_ABORTED, EXIT_DEVIATED, EXIT_INVALID,
              EXIT_PREFLIGHT, EXIT_HELD)


def worst_exit(codes: list[int]) -> int:
    def rank(code: int) -> float:
        return float(EXIT_ORDER.index(code)) if code in EXIT_ORDER else 0.5

    return min(codes, key=rank) if codes else EXIT_HELD


def write_index(path: Path, title: str, rows: list[dict[str, Any]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(report_html.render_index(title, rows, path.parent), encoding="utf-8")
