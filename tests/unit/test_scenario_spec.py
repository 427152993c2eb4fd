"""Scenario spec: target.reference as a mapping (when, neighbour), fault includes, fallback variants, and
the dry-run plan of steps whose target a deployment provides."""

from __future__ import annotations

from pathlib import Path

import pytest

from chaoskit.engine.plan import UNRESOLVED, deferred_paths, plan_faults
from chaoskit.errors import SpecError
from chaoskit.experiment.loader import load_experiment
from chaoskit.experiment.models import Reference
from chaoskit.reference.scenario import options

HEAD = """apiVersion: chaoskit/v1
kind: Experiment
metadata: {name: s}
"""
PROBE = """steadyState:
  probes: [{name: p, type: http, url: "{target.url}/", expect: {status: 200}}]
"""


def write(tmp_path: Path, body: str, name: str = "e.yaml") -> Path:
    f = tmp_path / name
    f.write_text(HEAD + body)
    return f


OWN = """vars: {fix: false}
target:
  reference:
    engine: triton
    replicas: 2
    model_params: {isolate_kv_cache: "{var.fix}"}
    when: {fix: {health: latency, latency_threshold: 300ms, model_params: {cache_eviction_policy: lru}}}
""" + PROBE + """method:
  - inject: {type: process.signal, pid: "{target.replica_pid}", signal: SIGSTOP}
    duration: 1s
  - inject: {type: host.memory_pressure, size: 1MiB}
    duration: 1s
"""


@pytest.mark.parametrize("fix, health, params", [
    ("false", "status", {"isolate_kv_cache": "false"}),
    ("true", "latency", {"isolate_kv_cache": "true", "cache_eviction_policy": "lru"}),
])
def test_when_lays_the_fix_over_the_deployment(tmp_path, fix, health, params):
    loaded = load_experiment(write(tmp_path, OWN), {"fix": fix}, strict=True)
    ref = loaded.experiment.target.reference
    assert isinstance(ref, Reference)
    opts = options(ref.effective(loaded.variables))
    assert (opts.health, opts.model_params) == (health, params)
    assert opts.latency_threshold_ms == (300.0 if fix == "true" else 500.0)


def test_mcp_asks_for_tiny_mcp_and_its_facts_are_substituted(tmp_path):
    from chaoskit.reference.scenario import describe

    body = OWN.replace("engine: triton", "engine: tiny-openai\n    mcp: true").replace(
        'url: "{target.url}/"', 'url: "{target.mcp.url}"')
    facts = {"url": "http://127.0.0.1:18000", "replica_pid": 4242, "mcp": {"url": "http://127.0.0.1:18007/mcp"}}
    exp = load_experiment(write(tmp_path, body), deployed=facts).experiment
    ref = exp.target.reference
    assert isinstance(ref, Reference) and ref.mcp
    assert options(ref).mcp and options(ref).settings()["mcp"] is True and "mcp" not in options(Reference()).settings()
    assert describe(ref) == "tiny-openai x2, health status, tiny-mcp, isolate_kv_cache=false"
    assert exp.steady_state.probes[0].url == "http://127.0.0.1:18007/mcp"


def test_own_deployment_defers_its_facts_and_the_dry_run_plans_them_later(tmp_path):
    loaded = load_experiment(write(tmp_path, OWN), strict=True)  # strict, yet no deployment needed yet
    assert deferred_paths(loaded.deferred) == {"method[0]"}
    _, plan, problems = plan_faults(loaded.experiment.method, deferred_paths(loaded.deferred))
    assert [p.path for p in plan] == ["method[0]", "method[1]"]
    assert plan[0].changes == [UNRESOLVED] and plan[1].changes != [UNRESOLVED] and not problems


def test_deployed_facts_are_substituted_including_a_neighbours(tmp_path):
    body = OWN.replace('url: "{target.url}/"', 'url: "{target.neighbour.url}/"')
    facts = {"url": "http://127.0.0.1:18000", "replica_pid": 4242, "neighbour": {"url": "http://127.0.0.1:18040"}}
    exp = load_experiment(write(tmp_path, body), deployed=facts).experiment
    assert exp.method[0].inject.pid == 4242
    assert exp.steady_state.probes[0].url == "http://127.0.0.1:18040/"


def test_when_must_name_a_declared_variable(tmp_path):
    with pytest.raises(SpecError, match=r"target.reference.when.fixed: no variable 'fixed'"):
        load_experiment(write(tmp_path, OWN.replace("when: {fix:", "when: {fixed:")))


def test_a_neighbour_has_no_neighbour(tmp_path):
    body = OWN.replace("    replicas: 2\n", "    replicas: 2\n    neighbour: {engine: vllm, neighbour: {engine: triton}}\n")
    with pytest.raises(SpecError, match="a neighbour has no neighbour"):
        load_experiment(write(tmp_path, body))


def test_a_fault_step_is_included_from_faults_and_overridden(tmp_path):
    (tmp_path / "faults").mkdir()
    (tmp_path / "faults" / "hog.yaml").write_text("inject: {type: host.memory_pressure, size: 2MiB}\nduration: 9s\n")
    body = "target: {url: http://127.0.0.1:1}\n" + PROBE + "method:\n  - parallel:\n      - include: hog\n        duration: 2s\n"
    step = load_experiment(write(tmp_path, body)).experiment.method[0].parallel[0]
    assert (step.name, step.inject.type, step.duration) == ("hog", "host.memory_pressure", 2.0)
    with pytest.raises(SpecError, match=r"e.yaml:\d+:\d+: include: no fault step definition 'nope.yaml'"):
        load_experiment(write(tmp_path, body.replace("include: hog", "include: nope")))


FALLBACK = "target: {url: http://127.0.0.1:1}\n" + PROBE + """method:
  - inject: {type: host.memory_pressure, size: 100TiB}
    fallback:
      - {type: host.memory_pressure, size: 200TiB}
      - {type: host.memory_pressure, size: 1MiB}
    duration: 1s
"""


def test_the_first_fallback_this_host_can_apply_runs_and_the_plan_says_why(tmp_path):
    exp = load_experiment(write(tmp_path, FALLBACK)).experiment
    injectors, plan, problems = plan_faults(exp.method)
    assert not problems and injectors["method[0]"].spec.size == "1MiB"
    assert plan[0].variant == "host.memory_pressure" and len(plan[0].passed_over) == 2
    assert plan[0].changes[0].startswith("variant host.memory_pressure: host.memory_pressure cannot run here")


def test_when_no_variant_can_run_every_reason_is_a_preflight_problem(tmp_path):
    exp = load_experiment(write(tmp_path, FALLBACK.replace("size: 1MiB", "size: 300TiB"))).experiment
    _, _, problems = plan_faults(exp.method)
    assert len(problems) == 1 and problems[0].count("host.memory_pressure") >= 3


def test_fallback_only_on_an_inject_step(tmp_path):
    body = "target: {url: http://127.0.0.1:1}\n" + PROBE + "method:\n  - pause: 1s\n    fallback: []\n"
    load_experiment(write(tmp_path, body))  # an empty list is no fallback
    with pytest.raises(SpecError, match="only apply to an 'inject' step"):
        load_experiment(write(tmp_path, body.replace("fallback: []", "fallback: [{type: host.memory_pressure, size: 1MiB}]")))


def test_step_paths_name_a_step_by_its_place_in_the_method(tmp_path):
    from chaoskit.engine.plan import inject_steps

    fields = {("method", 2, "parallel", 1, "inject", "pid"), ("method", 0, "inject", "url"),
              ("steadyState", "probes", 0, "url"), ("method", 3, "parallel", 0, "parallel", 2, "inject", "x")}
    assert deferred_paths(fields) == {"method[0]", "method[2].parallel[1]", "method[3].parallel[0].parallel[2]"}
    body = "target: {url: http://127.0.0.1:1}\n" + PROBE + """method:
  - pause: 1s
  - {inject: {type: host.memory_pressure, size: 1MiB}, duration: 1s}
  - parallel:
      - pause: 1s
      - {inject: {type: host.memory_pressure, size: 1MiB}, duration: 1s}
"""
    exp = load_experiment(write(tmp_path, body)).experiment
    assert [path for path, _ in inject_steps(exp.method)] == ["method[1]", "method[2].parallel[1]"]


def test_the_free_port_block_search_starts_where_the_environment_says(monkeypatch):
    from chaoskit.errors import PreflightError
    from chaoskit.reference.scenario import FIRST_PORT, first_port

    monkeypatch.delenv("CHAOSKIT_REF_FIRST_PORT", raising=False)
    assert first_port() == FIRST_PORT == 18000
    monkeypatch.setenv("CHAOSKIT_REF_FIRST_PORT", "28000")
    assert first_port() == 28000
    for bad in ("80", "70000", "28k"):
        monkeypatch.setenv("CHAOSKIT_REF_FIRST_PORT", bad)
        with pytest.raises(PreflightError, match=f"CHAOSKIT_REF_FIRST_PORT={bad}: not a port number"):
            first_port()
