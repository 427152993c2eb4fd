"""deploy/grafana: the dashboard and the fault-window annotation snippet, checked structurally (no Grafana server
here): panels laid out on the 24-column grid, every query's metrics and legend labels exported by RunMetrics,
every variable defined, and every PromQL expression valid for promtool."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from chaoskit.model.enums import Phase, RunVerdict, Verdict
from chaoskit.model.events import FaultApplied, FaultReverted, RunEnded, Sample
from chaoskit.observe.metrics import RunMetrics

GRAFANA = Path(__file__).resolve().parents[2] / "deploy" / "grafana"
DASHBOARD = json.loads((GRAFANA / "chaoskit-dashboard.json").read_text())
SNIPPET = json.loads((GRAFANA / "fault-window-annotation.json").read_text())
VARIABLE = re.compile(r"\$\{?(\w+)")
SAMPLE_VARS = {"experiment": ".*", "run_id": ".*", "probe": ".*"}


def exported() -> dict[str, set[str]]:
    """Metric name -> its label names, as a run's registry exports them once every kind of event came."""
    m = RunMetrics("e", "r")
    for ev in (FaultApplied(id=1, step="s", type="t", applied_at=1.0), FaultReverted(id=1, type="t"),
               Sample(probe="p", phase=Phase.DURING, verdict=Verdict.OK, values={"v": 1}),
               RunEnded(verdict=RunVerdict.HELD, exit_code=0)):
        m(ev)
    return {s.name: set(s.labels) for family in m.registry.collect() for s in family.samples}


def queries() -> list[dict]:
    """Every query of the dashboard (panels and annotations) and the snippet's."""
    targets = [t for p in DASHBOARD["panels"] for t in p["targets"]]
    return targets + [a for a in DASHBOARD["annotations"]["list"] if "expr" in a] + [SNIPPET]


def test_the_dashboard_has_what_grafana_needs_and_panels_fit_the_grid():
    assert {"title", "uid", "schemaVersion", "panels", "templating", "annotations", "time"} <= set(DASHBOARD)
    ids = [p["id"] for p in DASHBOARD["panels"]]
    assert len(ids) == len(set(ids)) == 7
    cells: set[tuple[int, int]] = set()
    for p in DASHBOARD["panels"]:
        g = p["gridPos"]
        assert g["x"] + g["w"] <= 24 and g["w"] > 0 and g["h"] > 0, p["title"]
        mine = {(x, y) for x in range(g["x"], g["x"] + g["w"]) for y in range(g["y"], g["y"] + g["h"])}
        assert not mine & cells, f"{p['title']} overlaps another panel"
        cells |= mine
        refs = [t["refId"] for t in p["targets"]]
        assert p["targets"] and len(refs) == len(set(refs)), p["title"]


def test_every_query_reads_metrics_and_labels_a_run_exports():
    names = exported()
    assert "chaoskit_fault_active" in names and names["chaoskit_fault_active"] >= {"step", "type", "target"}
    for q in queries():
        used = set(re.findall(r"\bchaoskit_[a-z_]+", q["expr"]))
        assert used and used <= set(names), (q["expr"], used - set(names))
        labels = set().union(*(names[m] for m in used))
        legends = re.findall(r"\{\{(\w+)\}\}", q.get("legendFormat", "") + q.get("titleFormat", "")
                             + q.get("textFormat", ""))
        by = re.findall(r"by \(([^)]*)\)", q["expr"])
        kept = {lb.strip() for b in by for lb in b.split(",")} if by else labels
        assert set(legends) <= kept, (q["expr"], set(legends) - kept)


def test_every_variable_used_is_defined_and_the_snippet_needs_none_but_its_data_source():
    defined = {v["name"] for v in DASHBOARD["templating"]["list"]}
    used = set(VARIABLE.findall(json.dumps(DASHBOARD))) - {"__all"}
    assert used <= defined, used - defined
    assert set(VARIABLE.findall(json.dumps(SNIPPET))) == {"datasource"}
    faults = [a for a in DASHBOARD["annotations"]["list"] if "chaoskit_fault_active" in a.get("expr", "")]
    assert len(faults) == 1 and faults[0]["enable"] is True
    assert {k: v for k, v in SNIPPET.items() if k not in ("name", "expr")} == {
        k: v for k, v in faults[0].items() if k not in ("name", "expr")}


def test_the_snippet_adds_the_fault_windows_to_an_existing_dashboard():
    existing = {"title": "LLM gateway", "panels": [], "annotations": {"list": [{"name": "deploys"}]}}
    existing["annotations"]["list"].append(SNIPPET)  # what `jq '.annotations.list += [$a]'` does
    assert [a["name"] for a in existing["annotations"]["list"]] == ["deploys", "chaoskit fault windows"]


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool (Debian's prometheus package) not here")
def test_every_expression_is_valid_promql(tmp_path):
    exprs = [VARIABLE.sub(lambda m: SAMPLE_VARS.get(m.group(1), m.group(0)), q["expr"]) for q in queries()]
    exprs += [VARIABLE.sub(lambda m: SAMPLE_VARS.get(m.group(1), m.group(0)), v["definition"].replace(
        "label_values(", "group by (x) (").rsplit(",", 1)[0] + ")")
        for v in DASHBOARD["templating"]["list"] if v["type"] == "query"]
    rules = {"groups": [{"name": "grafana", "rules": [{"record": f"chaoskit:check_{i}", "expr": e}
                                                      for i, e in enumerate(exprs)]}]}
    path = tmp_path / "rules.yml"
    path.write_text(yaml.safe_dump(rules))
    proc = subprocess.run(["promtool", "check", "rules", str(path)], capture_output=True, text=True, timeout=30)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"{len(exprs)} rules found" in proc.stdout
