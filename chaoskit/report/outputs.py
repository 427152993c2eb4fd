"""Write what a run found, each a rendering of its RunView: the JSON summary, JUnit XML for CI (one testsuite per
experiment), the self-contained HTML report; and a suite's exit code and index."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any
from xml.etree import ElementTree as ET

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
from chaoskit.model.enums import Phase, RunVerdict, Verdict
from chaoskit.model.events import Sample
from chaoskit.report import html
from chaoskit.report.view import RunView, SuiteRow


def summary(view: RunView) -> dict[str, Any]:
    """summary.json: the run's outcome and every sample, as its journal tells them."""
    return {
        "run_id": view.run_id,
        "experiment": view.experiment,
        "description": view.description,
        "status": view.state,
        "verdict": view.verdict,
        "exit_code": view.exit_code,
        "deviated": bool(view.deviations),
        "deviations": view.deviations,
        "reason": view.reason,
        "rollback_complete": view.rollback_complete,
        "started": view.started,
        "ended": view.ended,
        "duration_s": round(view.ended - view.started, 3),
        "recovery_s": view.recovery_s,
        "ledger": view.ledger,
        "states": [{"state": s, "t": t} for s, t in view.states],
        "plan": [p.model_dump() for p in view.plan],
        "faults": [f.to_json() for f in view.faults],
        "samples": [_sample(s) for s in view.samples],
        **_detection(view),
    }


def _detection(view: RunView) -> dict[str, Any]:
    """With alert probes: time to detect and resolve each fault per expected alert, MTTD/MTTR, noisy rules."""
    found = view.detection()
    return {"detection": found.to_json()} if found.outcomes or found.noisy else {}


def _sample(s: Sample) -> dict[str, Any]:
    return {k: v for k, v in s.to_json().items() if k != "event"}


def write_summary(path: Path, data: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2, default=str))


_PHASE_STATES = {"before": ("hypothesis_before",), "during": ("method",), "after": ("hypothesis_after",)}


def phase_seconds(states: list[tuple[str, float]]) -> dict[str, float]:
    """How long each steady-state phase lasted: the time the run spent in its states (the history)."""
    spent: dict[str, float] = {}
    for (state, t), (_, t_next) in zip(states, states[1:], strict=False):
        spent[state] = spent.get(state, 0.0) + t_next - t
    return {phase: sum(spent.get(s, 0.0) for s in names) for phase, names in _PHASE_STATES.items()}


def junit_suite(view: RunView) -> ET.Element:
    """One testsuite: a testcase per (phase, probe) lasting the phase, plus one for rollback and one for
    safeguards. A phase's testcase fails exactly when the engine's judgement of it failed (RunView.phase_outcome:
    never a grace/between/interim/safeguard sample, never an after sample the steady state recovered from in
    time); a run that deviated for a reason no such testcase shows (a target that exited, a fault no sample
    judged) fails a `deviations` testcase. Failure lines are stamped with seconds since the run started, in time
    order."""
    cases: dict[tuple[str, str], list[Sample]] = {}
    for s in view.samples:
        cases.setdefault((s.phase, s.probe), []).append(s)
    name = view.experiment
    suite = ET.Element("testsuite", name=f"chaoskit.{name}", timestamp=time.strftime(
        "%Y-%m-%dT%H:%M:%S", time.localtime(view.started)), time=f"{round(view.ended - view.started, 3):.3f}")
    failures = errors = 0

    def case(name: str, classname: str, seconds: float = 0.0) -> ET.Element:
        return ET.SubElement(suite, "testcase", name=name, classname=classname, time=f"{seconds:.3f}")

    spans = phase_seconds(view.states)
    for (phase, probe), samples in cases.items():
        tc = case(f"{phase}: {probe}", f"chaoskit.{name}.{phase}", spans.get(phase, 0.0))
        bad = sorted((s for s in samples if s.verdict is not Verdict.OK), key=lambda s: s.t)
        outcome = view.phase_outcome(probe, phase)
        lines = "\n".join(f"+{s.t - view.started:.3f}s {s.verdict}: {s.why()}" for s in bad)
        if outcome == "fail":
            failures += 1
            last = bad[-1] if phase == Phase.AFTER else bad[0]  # after: what kept it from holding at the end
            what = ("the steady state did not hold again" if phase == Phase.AFTER else
                    f"{len(bad)}/{len(samples)} samples did not hold")
            ET.SubElement(tc, "failure", message=f"{what}: {last.why()}").text = lines
        elif bad and outcome == "ok":  # after: failed first, then held again within steadyState.after.within
            ET.SubElement(tc, "system-out").text = (f"{len(bad)}/{len(samples)} samples did not hold before the "
                                                    f"steady state held again (not a failure):\n{lines}")
    tc = case("rollback", f"chaoskit.{name}")
    if not view.rollback_complete:
        errors += 1
        ET.SubElement(tc, "error", message=f"rollback incomplete: {view.reason}")
    tc = case("safeguards", f"chaoskit.{name}")
    if view.verdict is RunVerdict.ABORTED:
        failures += 1
        ET.SubElement(tc, "failure", message=view.reason)
    if view.deviations and not failures:  # the run deviated, and no testcase above says why
        failures += 1
        ET.SubElement(case("deviations", f"chaoskit.{name}"), "failure", message="; ".join(view.deviations))
    if view.verdict is RunVerdict.FAILED:
        errors += 1
        ET.SubElement(case("run", f"chaoskit.{name}"), "error", message=view.reason)
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


def write_junit(path: Path, view: RunView) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    ET.ElementTree(junit_suite(view)).write(path, encoding="utf-8", xml_declaration=True)


def write_junit_suites(path: Path, suites: list[ET.Element], name: str = "chaoskit") -> None:
    """A suite's JUnit file: one testsuite per experiment."""
    root = ET.Element("testsuites", name=name)
    for key in ("tests", "failures", "errors", "skipped"):
        root.set(key, str(sum(int(s.get(key, "0")) for s in suites)))
    root.extend(suites)
    path.parent.mkdir(parents=True, exist_ok=True)
    ET.ElementTree(root).write(path, encoding="utf-8", xml_declaration=True)


# -- the report (built from the journal alone) ------------------------------------------------------------
def write_html(path: Path, view: RunView) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(html.render(view), encoding="utf-8")


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


def write_index(path: Path, title: str, rows: list[SuiteRow]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(html.render_index(title, rows, path.parent), encoding="utf-8")
