"""The matrix: its file checked at validation (file, line, field; every cell's experiment before any runs), the
cells in order, and the measures computed from a journal and a tap log written here, by hand."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from chaoskit.app.matrix import prepare
from chaoskit.app.matrix_measures import measure, time_to_eject
from chaoskit.app.matrix_report import markdown
from chaoskit.errors import SpecError
from chaoskit.experiment.loader import load_experiment
from chaoskit.experiment.matrix import cells, experiment, load_matrix
from chaoskit.paths import library

HEAD = """apiVersion: chaoskit/v1
kind: Matrix
metadata: {name: m}
gateways: [nginx, haproxy]
"""
HANG = """faults:
  - name: hang
    inject: {type: process.signal, pid: "{target.replica_pids[0]}", signal: SIGSTOP}
"""


def write(tmp_path: Path, text: str) -> Path:
    (tmp_path / "m.yaml").write_text(text)
    return tmp_path / "m.yaml"


def test_cells_run_gateway_by_gateway_and_each_is_a_valid_experiment(tmp_path: Path) -> None:
    spec = load_matrix(write(tmp_path, HEAD + HANG + """  - name: slow
    inject: {type: process.cpu_throttle, pid: "{target.replica_pids[0]}", cpu: "5%"}
"""))
    assert [c.id for c in cells(spec)] == ["nginx--hang", "nginx--slow", "haproxy--hang", "haproxy--slow"]
    doc = experiment(spec, cells(spec)[0])
    assert doc["target"]["reference"] == {"engine": "tiny-openai", "replicas": 2, "gateway": "nginx", "netns": True}
    assert doc["steadyState"]["probes"][0]["mode"] == "continuous"
    out = tmp_path / "out"
    _, todo = prepare(tmp_path / "m.yaml", out, resume=False)
    for c in todo:
        load_experiment(out / "cells" / c.id / "experiment.yaml", strict=False)


def test_a_readmit_window_keeps_the_load_going_after_the_revert_recorded_not_judged(tmp_path: Path) -> None:
    plain = load_matrix(write(tmp_path, HEAD + HANG))
    doc = experiment(plain, cells(plain)[0])
    assert len(doc["method"]) == 1 and "between" not in doc["steadyState"]["during"]
    spec = load_matrix(write(tmp_path, HEAD + "readmit_window: 10s\n" + HANG))
    (tmp_path / "cell.yaml").write_text(json.dumps(experiment(spec, cells(spec)[0])))
    exp = load_experiment(tmp_path / "cell.yaml", strict=False).experiment
    assert [(s.name, s.pause) for s in exp.method] == [("hang", None), ("readmit-window", 10.0)]
    assert exp.steady_state.during is not None and exp.steady_state.during.between == "record"
    assert exp.steady_state.after.within == spec.recovery


@pytest.mark.parametrize(("text", "expected"), [
    (HEAD.replace("haproxy", "traefik") + HANG, "m.yaml:4:"),
    (HEAD + HANG + HANG.removeprefix("faults:\n"), "faults: names must differ: hang"),
    (HEAD + "gateway_params: {nginx: {maxfails: 2}}\n" + HANG, "nginx takes no maxfails"),
    (HEAD + HANG.replace("hang", "Hang!"), "lower case letters"),
])
def test_a_wrong_matrix_file_is_refused_naming_where(tmp_path: Path, text: str, expected: str) -> None:
    with pytest.raises(SpecError) as e:
        load_matrix(write(tmp_path, text))
    assert expected in str(e.value)


def test_a_cell_whose_fault_is_wrong_stops_the_matrix_before_any_cell_runs(tmp_path: Path) -> None:
    bad = HEAD + HANG.replace("signal: SIGSTOP", "signal: SIGNOPE")
    with pytest.raises(SpecError) as e:
        prepare(write(tmp_path, bad), tmp_path / "out", resume=False)
    assert "cell nginx--hang" in str(e.value) and "signal" in str(e.value)
    assert not (tmp_path / "out" / "matrix.json").exists()


def test_the_bundled_matrix_has_five_gateways_and_ten_faults_all_valid(tmp_path: Path) -> None:
    spec, todo = prepare(library("matrices") / "gateways.yaml", tmp_path / "out", resume=False)
    assert len(spec.gateways) == 5 and len(spec.faults) == 10 and len(todo) == 50


def test_fault_runs_one_column_and_model_params_reach_the_replicas(tmp_path: Path) -> None:
    spec, todo = prepare(library("matrices") / "gateways.yaml", tmp_path / "out", resume=False,
                         only=["long-prompts"])
    assert [f.name for f in spec.faults] == ["long-prompts"] and [c.id for c in todo] == [
        f"{g}--long-prompts" for g in spec.gateways]
    assert experiment(spec, todo[0])["target"]["reference"]["model_params"] == {"max_context": 400000}
    with pytest.raises(SpecError, match="--fault nope: no such fault"):
        prepare(library("matrices") / "gateways.yaml", tmp_path / "out2", resume=False, only=["nope"])


def test_time_to_eject_is_where_replica_0s_share_stays_at_most_5_percent() -> None:
    start = 100.0
    # 0.0-1.0 s: half the attempts to replica 0; from 1.0 s on: none
    attempts = [{"t": start + i * 0.05, "replica": "r0" if (i < 20 and i % 2) else "r1"} for i in range(80)]
    assert time_to_eject(attempts, "r0", start, start + 4.0) == 1.0
    # replica 0 keeps a third: never
    attempts = [{"t": start + i * 0.05, "replica": "r0" if i % 3 == 0 else "r1"} for i in range(80)]
    assert time_to_eject(attempts, "r0", start, start + 4.0) is None


def journal(path: Path, applied: float, reverted: float, samples: list[tuple], recovered: bool) -> Path:
    events = [{"t": applied, "event": "fault_applied", "id": 1, "applied_at": applied},
              *({"t": t, "event": "sample", "probe": probe, "phase": "during", "verdict": "fail", "values": v}
                for t, probe, v in samples),
              {"t": reverted, "event": "fault_reverted", "id": 1},
              *([{"t": reverted + 2, "event": "recovered", "seconds": 2.0}] if recovered else []),
              {"t": reverted + 3, "event": "end", "verdict": "deviated", "exit_code": 1, "deviations": ["x"]}]
    path.write_text("".join(json.dumps(e) + "\n" for e in events))
    return path


def test_measures_from_a_journal_and_a_tap_log(tmp_path: Path) -> None:
    applied, reverted = 1000.0, 1004.0
    j = journal(tmp_path / "j.jsonl", applied, reverted, [
        (1002.0, "clients", {"requests": 40, "ok": 30, "sent_on_time_ratio": 1.0, "all_p99_ms": 2010.0,
                             "errors": {"timeout": 8, "stream_truncated": 2}}),
        (1003.0, "answers", {"requests": 8, "ok": 5, "failures.restarted": 2, "failures.gap": 1,
                             "failures.mismatch": 0}),
        (1004.0, "clients", {"requests": 40, "ok": 40, "sent_on_time_ratio": 0.97, "all_p99_ms": 80.0,
                             "errors": {}}),
        (1004.0, "answers", {"requests": 8, "ok": 7, "failures.restarted": 1})],
        recovered=False)
    # 20/s for 4 s = 80 client requests; 10 retried once (90 attempts); replica 0 gets none after 1 s
    attempts = [{"t": applied + 0.05 * i, "replica": "r0" if (i < 20 and i % 2) else "r1",
                 "path": "/v1/completions"} for i in range(80)]
    attempts += [{"t": applied + 0.05 * i + 0.01, "replica": "r1", "path": "/v1/completions"} for i in range(10)]
    attempts += [{"t": applied + 0.5, "replica": "r0", "path": "/health"},  # neither the health checks nor the
                 {"t": applied + 0.6, "replica": "r0", "path": "/v1/chat/completions"},  # answers probe's chats
                 {"t": reverted + 0.2, "replica": "r0", "path": "/v1/completions", "status": 0},  # cut: not back
                 {"t": reverted + 1.5, "replica": "r0", "path": "/v1/completions", "status": 200}]
    tap = tmp_path / "tap.jsonl"
    tap.write_text("".join(json.dumps(a) + "\n" for a in attempts))
    m = measure(j, tap, "r0", rate=20)
    assert (m.client_requests, m.client_errors, m.error_rate) == (80, 10, 0.125)
    assert (m.all_p99_ms, m.sent_on_time_ratio) == (2010.0, 0.97)
    assert m.stream_outcomes["stream_truncated"] == 2 and m.errors_by_kind["timeout"] == 8
    assert (m.upstream_attempts, m.to_replica0, m.amplification) == (90, 10, 1.125)
    # the first upstream attempt after the revert at +0.2 s (a cut one), replica 0's first answer 1.3 s after it
    assert (m.time_to_eject_s, m.first_attempt_after_s, m.time_to_readmit_s, m.metastable) == (1.0, 0.2, 1.3, True)
    assert (m.answers, m.answer_grades) == (16, {"restarted": 3, "gap": 1})
    text = markdown({"matrix": "m", "description": "", "chaoskit": "0", "engine": "tiny-openai", "replicas": 2,
                     "host": "h", "date": "d", "duration_s": 4, "recovery_s": 4, "load": {},
                     "gateways": ["nginx", "haproxy"], "versions": {"nginx": "1"},
                     "faults": [{"name": "hang", "description": "frozen"}],
                     "cells": [{"gateway": "nginx", "fault": "hang", "measures": m.to_json()}]})
    assert "| nginx 1 | deviated |" in text and "| haproxy | - |" in text and "| nginx 1 | 12.5% |" in text
    assert "| nginx 1 | 12/16 whole, restarted 3, gap 1 |" in text


def test_a_cell_unsteady_before_its_fault_runs_once_more_its_first_run_set_aside(tmp_path: Path,
                                                                                 monkeypatch) -> None:
    from chaoskit.app import matrix as app

    unsteady = tmp_path / "unsteady.jsonl"
    unsteady.write_text(json.dumps({"t": 1.0, "event": "end", "verdict": "deviated", "exit_code": 1, "deviations": [
        "steady state did not hold before the method; nothing was injected"]}) + "\n")
    assert measure(unsteady, None, "r0", rate=20).verdict == "unsteady"
    other = tmp_path / "other.jsonl"  # deviated before any apply, for another reason: a verdict like any other
    other.write_text(unsteady.read_text().replace("steady state did not hold before the method", "a safeguard"))
    assert measure(other, None, "r0", rate=20).verdict == "deviated"
    deviated = journal(tmp_path / "j.jsonl", 1000.0, 1004.0, [], recovered=True)
    runs = iter([unsteady, deviated, unsteady, unsteady])

    def fake_run_cell(spec, cell, out):  # what run_cell leaves in the cell's folder, and its measures
        d = app.cell_dir(out, cell)
        (d / "run").mkdir(exist_ok=True)
        (d / "ref-1").mkdir(exist_ok=True)
        return {"cell": cell.id, "gateway": cell.gateway, "fault": cell.fault.name,
                "measures": measure(next(runs), None, "r0", rate=20).to_json()}

    monkeypatch.setattr(app, "run_cell", fake_run_cell)
    said: list[str] = []
    outcome = app.run_matrix(write(tmp_path, HEAD + HANG), tmp_path / "out", resume=False, say=said.append)
    first, second = outcome.results  # nginx--hang: unsteady, then deviated; haproxy--hang: unsteady twice
    assert first["measures"]["verdict"] == "deviated" and first["unsteady_before"] == 1
    assert outcome.incomplete == ["haproxy--hang"]
    aside = tmp_path / "out" / "cells" / "nginx--hang" / "unsteady-1"
    assert (aside / "run").is_dir() and (aside / "ref-1").is_dir()
    assert second["unsteady_before"] == 1 and (aside.parent.parent / "haproxy--hang" / "unsteady-1").is_dir()
    assert any("nginx--hang: the steady state did not hold before the fault" in s for s in said)
