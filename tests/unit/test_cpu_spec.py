"""process.cpu_throttle / host.cpu_stress specs, the shared pid / name / child_of selector rules (process.signal
too), `{target.*}` placeholders in child_of, the published schema, and finding the cpu controller."""

from __future__ import annotations

import re
from pathlib import Path

import jsonschema
import pytest
from pydantic import ValidationError

from chaoskit.errors import PreflightError
from chaoskit.experiment.loader import load_experiment
from chaoskit.experiment.schema import experiment_schema
from chaoskit.injectors.cpu.fault import CpuStressSpec, CpuThrottleSpec
from chaoskit.injectors.process.fault import ProcessSignalSpec
from chaoskit.targets.cgroups import CpuHierarchy, find_cpu_hierarchy


def throttle(**kw) -> CpuThrottleSpec:
    return CpuThrottleSpec.model_validate({"type": "process.cpu_throttle", **kw})


def stress(**kw) -> CpuStressSpec:
    return CpuStressSpec.model_validate({"type": "host.cpu_stress", **kw})


@pytest.mark.parametrize("cpu, share", [(0.2, 0.2), ("20%", 0.2), ("0.5", 0.5), ("150%", 1.5), (2, 2.0)])
def test_cpu_share_forms(cpu, share):
    assert throttle(pid=42, cpu=cpu).cpu == pytest.approx(share)


def test_quota_and_period_in_microseconds():
    s = throttle(pid=42, cpu="20%", period="50ms")
    assert (s.quota_us(), s.period_us()) == (10_000, 50_000)
    assert (throttle(pid=42, cpu=1.5).quota_us(), throttle(pid=42, cpu=1.5).period_us()) == (150_000, 100_000)


@pytest.mark.parametrize("kw, message", [
    ({"pid": 42}, "Field required"),
    ({"pid": 42, "cpu": 0}, "greater than 0"),
    ({"pid": 42, "cpu": -0.5}, "greater than 0"),
    ({"pid": 42, "cpu": "-20%"}, "expected a number like 0.2 or a percentage"),
    ({"pid": 42, "cpu": "fast"}, "expected a number like 0.2 or a percentage"),
    ({"pid": 42, "cpu": "20 percent"}, "expected a number like 0.2 or a percentage"),
    ({"pid": 42, "cpu": True}, "expected a number like 0.2"),
    ({"pid": 42, "cpu": 5000}, "less than or equal to 1024"),
    ({"pid": 42, "cpu": 0.005}, r"500us of CPU time per period; the kernel needs at least 1000us"),
    ({"pid": 42, "cpu": 0.5, "period": "2s"}, r"period must be between 1ms and 1s \(got 2000ms\)"),
    ({"pid": 42, "cpu": 0.5, "period": "500us"}, r"period must be between 1ms and 1s"),
    ({"pid": 42, "cpu": 0.5, "period": "soon"}, "expected a duration"),
    ({"pid": 0, "cpu": 0.5}, "PIDs are positive"),
    ({"pid": [], "cpu": 0.5}, "PIDs are positive"),
    ({"pid": [12, -1], "cpu": 0.5}, "PIDs are positive"),
    ({"child_of": 0, "cpu": 0.5}, "greater than 0"),
    ({"name": "(", "cpu": 0.5}, "not a valid regular expression"),
    ({"pid": 42, "cpu": 0.5, "quota": 1}, "Extra inputs are not permitted"),
])
def test_invalid_throttle_specs(kw, message):
    with pytest.raises(ValidationError, match=message):
        throttle(**kw)


SELECTORS = [  # (fields, valid?)
    ({"pid": 42}, True),
    ({"name": "^vllm"}, True),
    ({"child_of": 42}, True),
    ({"child_of": 42, "name": "EngineCore"}, True),
    ({}, False),
    ({"pid": 42, "name": "x"}, False),
    ({"pid": 42, "child_of": 7}, False),
    ({"pid": 42, "name": "x", "child_of": 7}, False),
]


@pytest.mark.parametrize("fields, ok", SELECTORS)
@pytest.mark.parametrize("make, options", [
    (lambda **kw: throttle(cpu=0.5, **kw), "pid, name, child_of (optionally with name), cgroup, or kubernetes"),
    (lambda **kw: ProcessSignalSpec.model_validate({"type": "process.signal", **kw}),
     "pid, name, child_of (optionally with name), or kubernetes"),
], ids=["cpu_throttle", "signal"])
def test_selector_rules(make, options, fields, ok):
    if ok:
        spec = make(**fields)
        assert (spec.pid, spec.name, spec.child_of) == (fields.get("pid"), fields.get("name"), fields.get("child_of"))
    else:
        with pytest.raises(ValidationError, match=re.escape(f"give exactly one target: {options}; got")):
            make(**fields)


@pytest.mark.parametrize("kw, message", [
    ({"workers": 0}, "greater than 0"),
    ({"load": 0}, "greater than 0"),
    ({"load": 1.5}, "less than or equal to 1"),
    ({"load": "150%"}, "less than or equal to 1"),
    ({"load": "lots"}, "expected a number like 0.2 or a percentage"),
    ({"nice": 20}, "less than or equal to 19"),
    ({"nice": -21}, "greater than or equal to -20"),
    ({"cgroup": "x"}, "Extra inputs are not permitted"),
])
def test_invalid_stress_specs(kw, message):
    with pytest.raises(ValidationError, match=message):
        stress(**kw)


def test_stress_defaults_and_forms():
    s = stress()
    assert (s.workers, s.load, s.nice) == (None, 1.0, 0)
    assert stress(workers=3, load="80%", nice=10).load == pytest.approx(0.8)


EXPERIMENT = """\
apiVersion: chaoskit/v1
kind: Experiment
metadata:
  name: throttle-engine
target:
{target}
steadyState:
  probes:
    - name: up
      type: http
      url: http://127.0.0.1:8000/health
method:
  - inject:
      type: process.cpu_throttle
      child_of: "{{target.replica_pid}}"
      name: "^VLLM::EngineCore$"
      cpu: 20%
    duration: 5s
  - inject:
      type: process.signal
      child_of: "{{target.replica_pid}}"
      name: EngineCore
    duration: 1s
"""


def test_child_of_placeholder_is_an_int_before_validation(tmp_path: Path):
    f = tmp_path / "exp.yaml"
    f.write_text(EXPERIMENT.format(target="  facts: {replica_pid: 4242}"))
    method = load_experiment(f).experiment.method
    assert method[0].inject.child_of == 4242 and method[0].inject.cpu == pytest.approx(0.2)
    assert method[1].inject.child_of == 4242


def test_child_of_placeholder_deferred_to_run_time(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("CHAOSKIT_REF_DIR", str(tmp_path / "no-ref"))
    f = tmp_path / "exp.yaml"
    f.write_text(EXPERIMENT.format(target="  reference: vllm"))
    loaded = load_experiment(f, strict=False)
    assert any("{target.replica_pid} is resolved at run time" in n for n in loaded.notes)


def test_published_schema_describes_and_accepts_the_new_injectors(tmp_path: Path):
    import yaml

    schema = experiment_schema()
    for name in ("CpuThrottleSpec", "CpuStressSpec", "ProcessSignalSpec"):
        props = schema["$defs"][name]["properties"]
        missing = [k for k, v in props.items() if k != "type" and not v.get("description")]
        assert not missing, f"{name}: fields without a description: {missing}"
    doc = yaml.safe_load(EXPERIMENT.format(target="  reference: vllm"))
    doc["method"].append({"inject": {"type": "host.cpu_stress", "workers": 2, "load": "80%"}, "duration": "5s"})
    validator = jsonschema.Draft202012Validator(schema)
    assert not [e.message for e in validator.iter_errors(doc)]
    doc["method"][0]["inject"]["cpu"] = "fast"
    assert list(validator.iter_errors(doc))


def _mountinfo(tmp_path: Path, lines: list[str]) -> Path:
    f = tmp_path / "mountinfo"
    f.write_text("".join(f"{i} 1 0:{i} / {line}\n" for i, line in enumerate(lines, 30)))
    return f


def test_find_cpu_hierarchy(tmp_path: Path):
    v2 = tmp_path / "unified"
    v2.mkdir()
    (v2 / "cgroup.controllers").write_text("hugetlb io\n")
    v1 = f"{tmp_path}/cpu,cpuacct rw,relatime - cgroup cgroup rw,cpu,cpuacct"
    only_v2 = f"{v2} rw,relatime - cgroup2 cgroup2 rw"
    cpuset = f"{tmp_path}/cpuset rw,relatime - cgroup cgroup rw,cpuset"
    with pytest.raises(PreflightError, match="CPU throttling needs the cgroup v2 cpu controller or a v1 cpu "
                                             "hierarchy; neither is mounted here"):
        find_cpu_hierarchy(_mountinfo(tmp_path, [only_v2, cpuset]))
    h = find_cpu_hierarchy(_mountinfo(tmp_path, [only_v2, cpuset, v1]))
    assert (h.version, str(h.root)) == (1, f"{tmp_path}/cpu,cpuacct")
    (v2 / "cgroup.controllers").write_text("cpuset cpu io memory pids\n")
    h = find_cpu_hierarchy(_mountinfo(tmp_path, [v1, only_v2]))
    assert (h.version, h.root) == (2, v2)


def test_limit_files_of_both_versions(tmp_path: Path):
    """What is written where: v2 one `cpu.max` line, v1 period then quota (-1 = unlimited)."""
    v2, v1 = CpuHierarchy(2, tmp_path), CpuHierarchy(1, tmp_path)
    v2.write_limit(tmp_path, 20000, 100000)
    assert (tmp_path / "cpu.max").read_text() == "20000 100000\n" and v2.read_limit(tmp_path) == (20000, 100000)
    v2.write_limit(tmp_path, None, 100000)
    assert (tmp_path / "cpu.max").read_text() == "max 100000\n" and v2.read_limit(tmp_path) == (None, 100000)
    v1.write_limit(tmp_path, 10000, 50000)
    assert (tmp_path / "cpu.cfs_period_us").read_text() == "50000\n"
    assert (tmp_path / "cpu.cfs_quota_us").read_text() == "10000\n" and v1.read_limit(tmp_path) == (10000, 50000)
    (tmp_path / "cpu.cfs_quota_us").write_text("-1\n")
    assert v1.read_limit(tmp_path) == (None, 50000)
    assert v1.read_limit(tmp_path / "gone") == (None, 0) and v2.read_limit(tmp_path / "gone") == (None, 0)
    (tmp_path / "cpu.stat").write_text("nr_periods 10\nnr_throttled 7\nthrottled_usec 1234\n")
    assert v2.stat(tmp_path) == {"nr_periods": 10, "nr_throttled": 7, "throttled_usec": 1234}
