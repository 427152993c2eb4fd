"""target.reference.gateway: a third-party gateway with its params, checked at validation (file, line, field),
laid over by `when`, and turned into the deployment's options and the dry run's words."""

from __future__ import annotations

from pathlib import Path

import pytest

from chaoskit.errors import SpecError
from chaoskit.experiment.loader import load_experiment
from chaoskit.model.gateways import PARAMS
from chaoskit.reference.scenario import describe, options

HEAD = """apiVersion: chaoskit/v1
kind: Experiment
metadata: {name: g}
vars: {fix: false}
steadyState:
  probes: [{name: p, type: http, url: "{target.url}/health", expect: {status: 200}}]
method:
  - inject: {type: process.signal, pid: "{target.replica_pids[0]}", signal: SIGSTOP}
    duration: 1s
target:
  reference:
"""


def load(tmp_path: Path, reference: str, **kw):
    f = tmp_path / "g.yaml"
    f.write_text(HEAD + reference)
    return load_experiment(f, **kw)


def test_gateway_params_lay_over_the_defaults_and_when_lays_over_them(tmp_path: Path) -> None:
    exp = load(tmp_path, """    engine: tiny-openai
    gateway: haproxy
    gateway_params: {fall: 3}
    when: {fix: {gateway_params: {retries: 0}}}
""", cli_vars={"fix": "true"})
    ref = exp.experiment.target.reference.effective({"fix": "true"})
    opts = options(ref)
    assert (opts.gateway, opts.gateway_params) == ("haproxy", {"fall": "3", "retries": "0"})
    assert opts.settings()["gateway"] == "haproxy"
    words = describe(ref)
    assert "gateway haproxy (" in words and "fall=3" in words and "retries=0" in words and "inter=1s" in words


@pytest.mark.parametrize(("reference", "line", "expected"), [
    ("    engine: tiny-openai\n    gateway: nginx\n    gateway_params: {max_fail: 2}\n", 11,
     "nginx takes no max_fail"),
    ("    engine: tiny-openai\n    gateway: traefik\n", 13, "Input should be 'chaoskit'"),
    ("    gateway: vllm-router\n", 11, "engine tiny-openai or vllm"),
    ("    engine: tiny-openai\n    gateway: litellm\n    health: latency\n", 11, "uses its own health checks"),
    ("    engine: tiny-openai\n    gateway_params: {policy: random}\n", 11, "for a third-party gateway only"),
    ("    engine: tiny-openai\n    gateway: sglang-router\n    when: {fix: {gateway_params: {bogus: 1}}}\n", 11,
     "when.fix.gateway_params: sglang-router takes no bogus"),
])
def test_a_wrong_gateway_is_refused_at_validation_naming_file_and_line(tmp_path: Path, reference: str, line: int,
                                                                       expected: str) -> None:
    with pytest.raises(SpecError) as e:
        load(tmp_path, reference)
    text = str(e.value)
    assert expected in text and f"g.yaml:{line}:" in text, text


def test_every_third_party_gateway_has_a_kind_with_the_catalogs_name() -> None:
    from chaoskit.reference import gateways

    assert sorted(k.name for k in gateways.KINDS) == sorted(PARAMS)
    for k in gateways.KINDS:
        assert k().settings({}) == PARAMS[k.name].defaults


def test_haproxy_observes_real_answers_only_when_asked(tmp_path: Path) -> None:
    from chaoskit.reference.gateways.base import Upstream
    from chaoskit.reference.gateways.haproxy import HAProxy

    ups = [Upstream("r0", "127.0.0.1", 1001), Upstream("r1", "127.0.0.1", 1004)]

    def default_server(params: dict[str, str]) -> str:
        conf = HAProxy().launch(tmp_path, ups, 1000, 1008, HAProxy().settings(params), "m").config
        return next(line.strip() for line in conf.read_text().splitlines() if "default-server" in line)

    assert default_server({}) == "default-server inter 1s fall 2 rise 2"
    assert default_server({"observe": "layer7", "error_limit": "2", "on_error": "mark-down"}) == \
        "default-server inter 1s fall 2 rise 2 observe layer7 error-limit 2 on-error mark-down"


def test_a_gateway_param_outside_its_choices_is_refused_at_validation(tmp_path: Path) -> None:
    with pytest.raises(SpecError) as e:
        load(tmp_path, "    engine: tiny-openai\n    gateway: haproxy\n    gateway_params: {check: tcp}\n")
    assert "g.yaml:11:" in str(e.value) and "check: 'tcp' is not one of health, completion" in str(e.value)
