"""Loading experiment files: positions in errors, did-you-mean, hostile input, substitution, includes."""

import time
from pathlib import Path

import pytest

from chaoskit.errors import SpecError
from chaoskit.experiment.loader import load_experiment, parse_cli_vars
from chaoskit.experiment.yamlsafe import load_yaml

GOOD = """\
apiVersion: chaoskit/v1
kind: Experiment
metadata:
  name: demo
vars:
  pid: 4242
steadyState:
  probes:
    - name: up
      type: http
      url: "{target.url}/v2/health/ready"
      expect: {status: 200, headers: {X-Model-Latency: "< 950"}}
target:
  url: http://127.0.0.1:8000/
method:
  - inject:
      type: process.signal
      pid: "{pid}"
    duration: 15ms
"""


def load(tmp_path: Path, text: str, **kw):
    f = tmp_path / "exp.yaml"
    f.write_text(text)
    return load_experiment(f, **kw)


def errors_of(tmp_path: Path, text: str) -> str:
    with pytest.raises(SpecError) as e:
        load(tmp_path, text)
    return str(e.value)


def test_good_file_and_substitution(tmp_path):
    exp = load(tmp_path, GOOD).experiment
    assert exp.steady_state.probes[0].url == "http://127.0.0.1:8000/v2/health/ready"
    assert exp.method[0].inject.pid == 4242 and exp.method[0].duration == pytest.approx(0.015)
    assert load(tmp_path, GOOD, cli_vars={"pid": "77"}).experiment.method[0].inject.pid == 77


def test_wrong_duration_names_line_and_field(tmp_path):
    msg = errors_of(tmp_path, GOOD.replace("duration: 15ms", "duration: 15 parsecs"))
    assert "exp.yaml:19:5: method[0].duration: expected a duration like '15ms'" in msg


def test_negative_duration(tmp_path):
    assert "method[0].duration: a duration cannot be negative" in errors_of(
        tmp_path, GOOD.replace("duration: 15ms", "duration: -2s"))


def test_unknown_key_with_suggestion(tmp_path):
    msg = errors_of(tmp_path, GOOD.replace("    duration: 15ms", "    duraton: 15ms"))
    assert "exp.yaml:19:5: method[0].duraton: unknown field 'duraton' (did you mean 'duration'?)" in msg


def test_unknown_type_with_suggestion(tmp_path):
    msg = errors_of(tmp_path, GOOD.replace("type: process.signal", "type: process.sgnal"))
    assert "exp.yaml:17:7: method[0].inject.type: unknown type 'process.sgnal' (did you mean 'process.signal'?)" in msg


def test_wrong_type(tmp_path):
    msg = errors_of(tmp_path, GOOD.replace('pid: "{pid}"', "pid: {a: 1}"))
    assert "exp.yaml:18:7: method[0].inject.pid.int: Input should be a valid integer" in msg


def test_out_of_range(tmp_path):
    msg = errors_of(tmp_path, GOOD.replace('pid: "{pid}"', "pid: -5"))
    assert "method[0].inject.pid: PIDs are positive integers (and a list needs at least one)" in msg
    msg = errors_of(tmp_path, GOOD.replace('type: process.signal\n      pid: "{pid}"',
                                           "type: host.memory_pressure\n      size: -1GiB"))
    assert "method[0].inject.size: a size cannot be negative" in msg


def test_missing_field(tmp_path):
    msg = errors_of(tmp_path, GOOD.replace("  name: demo\n", "  description: x\n"))
    assert "exp.yaml:3:1: metadata.name: required field is missing" in msg


def test_bad_tolerance(tmp_path):
    msg = errors_of(tmp_path, GOOD.replace('"< 950"', '"< fast"'))
    assert "steadyState.probes[0].expect.headers.X-Model-Latency" in msg and "needs a number" in msg


def test_unknown_substitution(tmp_path):
    msg = errors_of(tmp_path, GOOD.replace('"{pid}"', '"{pidd}"'))
    assert "exp.yaml:18:7: method[0].inject.pid: unknown substitution {pidd} (did you mean {pid}?)" in msg


def test_several_errors_reported_at_once(tmp_path):
    msg = errors_of(tmp_path, GOOD.replace("duration: 15ms", "duration: x").replace("kind: Experiment", "kind: Exp"))
    assert "kind" in msg and "duration" in msg


def test_hostile_yaml(tmp_path):
    for text, expected in [
        ("a: 1\na: 2\n", "2:1: duplicate key 'a'"),
        ("a: !!python/object/apply:os.system [ls]\n", "is not allowed"),
        ("a: [\n", "invalid YAML"),
        ("", "the file is empty"),
        ("- 1\n- 2\n", "the top level must be a mapping"),
        ("a: 1\n---\nb: 2\n", "invalid YAML"),
    ]:
        assert expected in errors_of(tmp_path, text), text


def test_alias_bomb_is_refused_fast(tmp_path):
    lines = ['a0: &a0 ["x","x","x","x","x","x","x","x","x"]']
    lines += [f"a{i}: &a{i} [" + ",".join([f"*a{i-1}"] * 9) + "]" for i in range(1, 10)]
    t0 = time.monotonic()
    assert "alias bomb" in errors_of(tmp_path, "\n".join(lines) + "\n")
    assert time.monotonic() - t0 < 5


def test_binary_missing_and_directory(tmp_path):
    f = tmp_path / "junk.yaml"
    f.write_bytes(b"\x7fELF\x00\x01\x02")
    with pytest.raises(SpecError, match="binary"):
        load_experiment(f)
    f.write_bytes(b"a: \xff\xfe\n")
    with pytest.raises(SpecError, match="not valid UTF-8"):
        load_experiment(f)
    with pytest.raises(SpecError, match="no such file"):
        load_experiment(tmp_path / "nope.yaml")
    with pytest.raises(SpecError, match="is a directory"):
        load_experiment(tmp_path)


def test_positions():
    loc = load_yaml("a:\n  b:\n    - c: 1\n", "f.yaml")
    assert loc.where(("a", "b", 0, "c")) == "f.yaml:3:7"
    assert loc.where(("a", "b", 0, "missing")) == "f.yaml:3:7"


def test_cli_vars():
    assert parse_cli_vars(["a=1", "b=x=y"]) == {"a": "1", "b": "x=y"}
    with pytest.raises(SpecError):
        parse_cli_vars(["novalue"])


def test_probe_include(tmp_path):
    (tmp_path / "probes").mkdir()
    (tmp_path / "probes" / "ready.yaml").write_text(
        "type: http\nurl: http://127.0.0.1:9/ready\nexpect: {status: 200}\n")
    text = GOOD.replace("""    - name: up
      type: http
      url: "{target.url}/v2/health/ready"
      expect: {status: 200, headers: {X-Model-Latency: "< 950"}}""", "    - include: ready\n      timeout: 2s")
    probe = load(tmp_path, text).experiment.steady_state.probes[0]
    assert probe.name == "ready" and probe.url == "http://127.0.0.1:9/ready" and probe.timeout == 2
    assert "no probe definition 'nope.yaml'" in errors_of(tmp_path, text.replace("include: ready", "include: nope"))


def test_safeguard_must_name_a_probe(tmp_path):
    msg = errors_of(tmp_path, GOOD + "safeguards:\n  - probe: upp\n    abort_when: status != 200\n")
    assert "no steady-state probe named 'upp'" in msg


def test_bundled_experiments_validate():
    root = Path(__file__).resolve().parents[2] / "experiments"
    files = sorted(root.rglob("*.yaml"))
    assert files, "no bundled experiments"
    for f in files:
        load_experiment(f, strict=False)


def test_run_time_facts_in_typed_fields(tmp_path, monkeypatch):
    """A port that comes from the reference deployment validates before it exists and is an int once it does."""
    exp = Path(__file__).resolve().parents[2] / "experiments" / "network" / "drop.yaml"
    monkeypatch.setenv("CHAOSKIT_REF_DIR", str(tmp_path / "none"))
    load_experiment(exp, strict=False)
    with pytest.raises(Exception, match="not running"):
        load_experiment(exp, strict=True)
    (tmp_path / "ref").mkdir()
    (tmp_path / "ref" / "facts.json").write_text('{"url": "http://127.0.0.1:8000", "netns": "ck-r0", '
                                                 '"replica_port": 8001}')
    monkeypatch.setenv("CHAOSKIT_REF_DIR", str(tmp_path / "ref"))
    inject = load_experiment(exp, strict=True).experiment.method[0].inject
    assert inject.ports == [8001] and inject.target.netns == "ck-r0"


def test_run_time_fact_does_not_hide_real_errors(tmp_path):
    text = """\
apiVersion: chaoskit/v1
kind: Experiment
metadata: {name: x}
target: {reference: triton}
steadyState: {probes: [{name: t, type: command, argv: ["true"]}]}
method:
  - inject: {type: network.drop, target: {netns: "{target.netns}"}, percent: 30%, ports: ["{target.replica_port}", 70000]}
    duration: 1s
"""
    with pytest.raises(SpecError) as e:
        load(tmp_path, text, strict=False)
    assert "less than 65536" in str(e.value) and "valid integer" not in str(e.value)


@pytest.mark.parametrize("upstream, want", [("http://127.0.0.1:8400", "127.0.0.1:8400"),
                                            ("https://example.com/v1", "example.com:443"),
                                            ("http://[::1]:8000/health", "[::1]:8000"),
                                            ("127.0.0.1:9000", "127.0.0.1:9000")])
def test_proxy_upstream_url_gives_host_port(upstream, want):
    from chaoskit.injectors.proxy.fault import ProxySpec

    assert ProxySpec(type="network.proxy", listen="127.0.0.1:18080", upstream=upstream).upstream == want


@pytest.mark.parametrize("field, value", [("upstream", "ftp://x:1"), ("listen", "http://127.0.0.1:18080")])
def test_proxy_refuses_what_is_not_an_address(field, value):
    from pydantic import ValidationError

    from chaoskit.injectors.proxy.fault import ProxySpec

    spec = {"type": "network.proxy", "listen": "127.0.0.1:18080", "upstream": "127.0.0.1:9", field: value}
    with pytest.raises(ValidationError, match="expected host:port"):
        ProxySpec(**spec)


def test_a_misspelt_var_is_an_error_naming_the_declared_ones(tmp_path):
    from chaoskit.errors import SpecError

    f = Path(__file__).resolve().parents[2] / "experiments" / "basic" / "memory-pressure.yaml"
    assert load_experiment(f, {"size": "64MiB"}).experiment  # declared: fine
    with pytest.raises(SpecError, match=r"--var sizee: .* has no variable 'sizee' \(did you mean 'size'\?\); "
                                        r"it declares: port, size"):
        load_experiment(f, {"sizee": "64MiB"})
    g = tmp_path / "used.yaml"  # a variable used as {NAME} without a default is known too
    g.write_text(f.read_text().replace("vars:\n  port: 8765\n  size: 256MiB\n", ""))
    assert load_experiment(g, {"port": "1", "size": "1MiB"}).experiment


def test_every_url_fact_validates_before_the_deployment_exists(tmp_path):
    f = tmp_path / "r.yaml"
    f.write_text("apiVersion: chaoskit/v1\nkind: Experiment\nmetadata: {name: r}\ntarget: {reference: triton}\n"
                 "steadyState:\n  probes:\n    - {name: h, type: http, url: \"{target.replica_url}/v2/health/ready\"}\n"
                 "    - {name: m, type: prometheus, url: \"{target.replica_metrics_url}\", metric: x}\n"
                 "method:\n  - pause: 1s\n")
    assert load_experiment(f, strict=False).experiment


PROBE_LIBRARY = sorted((Path(__file__).resolve().parents[2] / "probes").glob("*.yaml"))


@pytest.mark.parametrize("probe", PROBE_LIBRARY, ids=lambda p: p.stem)
def test_every_library_probe_is_includable(tmp_path, probe):
    assert {p.stem for p in PROBE_LIBRARY} >= {"triton-ready", "vllm-health", "generate-through-gateway",
                                                 "sla-under-load", "kv-cache-metrics", "local-http-ready"}
    f = tmp_path / "inc.yaml"
    f.write_text(f"apiVersion: chaoskit/v1\nkind: Experiment\nmetadata: {{name: inc}}\ntarget: {{reference: triton}}\n"
                 f"vars: {{port: 8000}}\nsteadyState:\n  probes:\n    - {{include: {probe.stem}, name: p}}\n"
                 f"method:\n  - pause: 1s\n")
    exp = load_experiment(f, strict=False).experiment
    assert exp.steady_state.probes[0].name == "p"


def test_list_facts_are_addressable_per_replica(tmp_path, monkeypatch):
    import json

    ref = tmp_path / "ref"
    ref.mkdir()
    (ref / "facts.json").write_text(json.dumps({
        "url": "http://127.0.0.1:8000", "replica_pids": [11, 22],
        "replicas": [{"name": "triton-0", "pid": 11, "url": "http://10.0.0.2:8001", "netns": "a"},
                     {"name": "triton-1", "pid": 22, "url": "http://10.0.1.2:8001", "netns": "b"}]}))
    monkeypatch.setenv("CHAOSKIT_REF_DIR", str(ref))
    f = tmp_path / "r1.yaml"
    f.write_text("apiVersion: chaoskit/v1\nkind: Experiment\nmetadata: {name: r1}\ntarget: {reference: triton}\n"
                 "steadyState:\n  probes:\n    - {name: h, type: http, url: \"{target.replicas[1].url}/v2/health/ready\"}\n"
                 "method:\n  - inject: {type: process.signal, pid: \"{target.replica_pids[1]}\"}\n"
                 "  - inject: {type: network.drop, target: {netns: \"{target.replicas[1].netns}\"}, percent: 5%}\n")
    exp = load_experiment(f).experiment
    assert exp.method[0].inject.pid == 22 and exp.method[1].inject.target.netns == "b"
    assert exp.steady_state.probes[0].url == "http://10.0.1.2:8001/v2/health/ready"
    with pytest.raises(SpecError, match=r"unknown substitution \{target.replicas\[2\].pid\}"):
        f.write_text(f.read_text().replace("replica_pids[1]", "replicas[2].pid"))
        load_experiment(f)


def test_a_misspelt_expect_key_is_reported_at_its_own_line(tmp_path):
    text = """\
apiVersion: chaoskit/v1
kind: Experiment
metadata: {name: x}
steadyState:
  probes:
    - name: slo
      type: slo
      load: {url: "http://127.0.0.1:9/", rate: 5, duration: 1s}
      expect:
        p99_ms: "< 500"
        eror_rate: "< 0.1"
method:
  - pause: 1s
"""
    with pytest.raises(SpecError) as e:
        load(tmp_path, text, strict=False)
    assert str(e.value).endswith(":11:9: steadyState.probes[0].expect.eror_rate: unknown key 'eror_rate' for this "
                                 "probe (did you mean 'error_rate'?)")


HOLD = """\
apiVersion: chaoskit/v1
kind: Experiment
metadata: {name: x}
steadyState:
  probes:
    - name: sla
      type: slo
      load: {url: "http://127.0.0.1:PORT/v1/completions", rate: 5, duration: 1s, timeout: 10s}
method:
  - name: hold
    inject:
      type: llm.proxy
      listen: 127.0.0.1:18080
      upstream: http://127.0.0.1:8000
      faults:
        - {type: delay, delay: DELAY}
    duration: 8s
"""


@pytest.mark.parametrize("delay, port, want", [
    ("15s", 18080, ["step's duration (8s)", "every probe sending through it ('sla' (10s))"]),
    ("9s", 18080, ["step's duration (8s)"]),
    ("15s", 8000, ["step's duration (8s)"]),  # the probe goes to the server directly: no client of the fault
    ("150ms", 18080, []),
])
def test_a_hold_no_client_waits_out_is_a_warning(tmp_path, delay, port, want):
    loaded = load(tmp_path, HOLD.replace("DELAY", delay).replace("PORT", str(port)))
    assert len(loaded.warnings) == len(want)
    for warning, part in zip(loaded.warnings, want, strict=True):
        assert ":16:25: delay " in warning and part in warning
