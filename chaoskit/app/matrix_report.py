"""A matrix's results as matrix.json, matrix.md (a table per measure, gateways by faults) and matrix.html."""

from __future__ import annotations

import html
import json
from pathlib import Path
from typing import Any

SHOWN = (("verdict", "verdict"), ("error_rate", "client error rate"), ("all_p99_ms", "p99 of all requests (ms)"),
         ("time_to_eject_s", "time to eject replica 0 (s)"),
         ("first_attempt_after_s", "first upstream attempt after the revert (s)"),
         ("time_to_readmit_s", "time to readmit it (s, from that attempt)"),
         ("amplification", "upstream attempts per client request"), ("metastable", "goodput not back"))


def write_reports(out: Path, summary: dict[str, Any]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "matrix.json").write_text(json.dumps(summary, indent=2))
    (out / "matrix.md").write_text(markdown(summary))
    (out / "matrix.html").write_text(page(summary))


def grid(summary: dict[str, Any], key: str) -> tuple[list[str], list[list[str]]]:
    """(fault names, one row per gateway: its name then the measure per fault; '-' where not run yet)."""
    faults = [f["name"] for f in summary["faults"]]
    by = {(c["gateway"], c["fault"]): c["measures"] for c in summary["cells"]}
    rows = []
    for g in summary["gateways"]:
        row = [f"{g} {summary['versions'].get(g, '')}".strip()]
        for f in faults:
            m = by.get((g, f))
            row.append("-" if m is None else text(key, m))
        rows.append(row)
    return faults, rows


def text(key: str, m: dict[str, Any]) -> str:
    v = m.get(key)
    if key == "stream_outcomes":
        return ", ".join(f"{k.removeprefix('stream_')} {n}" for k, n in v.items() if n) or "none"
    if key == "answer_grades":
        wrong = sum(v.values())
        return f"{m['answers'] - wrong}/{m['answers']} whole" + "".join(f", {k} {n}" for k, n in v.items())
    if v is None:
        return "never" if key in ("time_to_eject_s", "time_to_readmit_s") else "n/a"
    if key == "metastable":
        return "yes" if v else "no"
    return f"{v:.1%}" if key == "error_rate" else str(v)


def markdown(summary: dict[str, Any]) -> str:
    lines = [f"# Matrix `{summary['matrix']}`", "", summary["description"], "",
             f"chaoskit {summary['chaoskit']}, engine {summary['engine']} x{summary['replicas']}, host "
             f"{summary['host']}, {summary['date']}; each fault {summary['duration_s']} s on replica 0, readmit "
             f"window {summary.get('readmit_window_s', 0)} s, recovery window {summary['recovery_s']} s; clients: "
             f"{json.dumps(summary['load'])}", ""]
    for key, title in (*SHOWN, ("stream_outcomes", "stream outcomes seen by the clients"),
                       ("answer_grades", "answers graded against the ones recorded before the fault")):
        faults, rows = grid(summary, key)
        lines += [f"## {title}", "", "| gateway | " + " | ".join(faults) + " |",
                  "|---|" + "---|" * len(faults), *("| " + " | ".join(r) + " |" for r in rows), ""]
    lines += ["## Faults", "", *(f"- `{f['name']}`: {f['description']}" for f in summary["faults"]), ""]
    return "\n".join(lines)


def page(summary: dict[str, Any]) -> str:
    faults, verdicts = grid(summary, "verdict")
    details = {k: grid(summary, k)[1] for k, _ in SHOWN[1:]}
    head = "".join(f"<th>{html.escape(f)}</th>" for f in faults)
    body = []
    for i, row in enumerate(verdicts):
        cells = "".join(
            f"<td class='{html.escape(v)}'><b>{html.escape(v)}</b><br>"
            + "<br>".join(f"{html.escape(t)}: {html.escape(details[k][i][j + 1])}" for k, t in SHOWN[1:])
            + "</td>" for j, v in enumerate(row[1:]))
        body.append(f"<tr><th>{html.escape(row[0])}</th>{cells}</tr>")
    return ("<!doctype html><meta charset='utf-8'><title>matrix " + html.escape(summary["matrix"]) + "</title>"
            "<style>td,th{border:1px solid #ccc;padding:4px;font:12px sans-serif;vertical-align:top}"
            ".held{background:#e6f4ea}.deviated{background:#fef7e0}</style>"
            f"<h1>{html.escape(summary['matrix'])}</h1><p>{html.escape(summary['description'])}</p>"
            f"<table><tr><th>gateway</th>{head}</tr>{''.join(body)}</table>")
