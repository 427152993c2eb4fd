"""Baselines (the before phase's values that `< 3x baseline` compares with) and the slo probe's group_by:
judging samples, validation errors naming the field, per-group recording, header capture, sender choice."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any, ClassVar

import pytest
from pydantic import ValidationError

from chaoskit.engine.steady_state import Baselines, take_sample
from chaoskit.errors import ChaoskitError, SpecError
from chaoskit.experiment.loader import load_experiment
from chaoskit.load import native
from chaoskit.load.clients import Outcome
from chaoskit.load.fastclient import _Conn
from chaoskit.load.recorder import MAX_GROUPS, Recorder
from chaoskit.load.spec import LoadSpec
from chaoskit.model.events import from_json
from chaoskit.probes.base import Probe
from chaoskit.probes.slo import SloProbeSpec


class Scripted(Probe):
    """A probe answering a scripted list of values (an Exception in the list is raised)."""

    type: ClassVar[str] = "scripted"
    summary: ClassVar[str] = "test"

    def __init__(self, spec: Any, answers: list[Any]):
        super().__init__(spec)
        self.answers = answers

    async def measure(self) -> dict[str, Any]:
        answer = self.answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer


LOAD = {"url": "http://127.0.0.1:9/", "rate": 10, "duration": 1}


def slo(**kw: Any) -> SloProbeSpec:
    return SloProbeSpec(type="slo", name=kw.pop("name", "p"), load=kw.pop("load", LOAD), **kw)


def sample(probe: Probe, phase: str, b: Baselines | None):
    return asyncio.run(take_sample(probe, phase, b))


def test_before_measures_the_baseline_and_later_samples_compare_with_it():
    spec = slo(expect={"p99_ms": "< 3x baseline", "error_rate": "<= baseline + 0.01", "ok": "> 0"})
    probe = Scripted(spec, [{"p99_ms": 120.5, "error_rate": 0.0, "ok": 5},
                            {"p99_ms": 361.5, "error_rate": 0.01, "ok": 5},
                            {"p99_ms": 361.4, "error_rate": 0.0100001, "ok": 5},
                            {"p99_ms": 100, "error_rate": 0.0, "ok": 5}])
    b = Baselines()
    before = sample(probe, "before", b)
    assert before.verdict == "ok"  # a baseline tolerance holds trivially in the before phase
    assert before.details[0] == "p99_ms: 120.5 baseline measured (later samples: < 3x baseline, 3 x 120.5 = 361.5)"
    assert b.get("p", "p99_ms") == (120.5, "")
    at_bound = sample(probe, "during", b)  # exactly 3x: `<` is false
    assert at_bound.verdict == "fail"
    assert at_bound.details[0] == "p99_ms: 361.5 < 3x baseline (3 x 120.5 = 361.5) is false"
    assert at_bound.details[1] == "error_rate: 0.01 <= baseline + 0.01 (0 + 0.01 = 0.01)"
    just_over = sample(probe, "during", b)
    assert just_over.verdict == "fail" and just_over.details[1].endswith("= 361.5)")
    assert "is false" in just_over.details[0]  # the failing clause first
    assert sample(probe, "after", b).verdict == "ok"
    assert b.get("p", "p99_ms") == (120.5, "")  # only the before phase records


def test_each_key_is_judged_once_with_its_resolved_threshold_and_outcome():
    """The sample records, per expected key, the value, the rule, the threshold it was judged against (a
    baseline resolved) and the outcome: what every report draws instead of judging again."""
    spec = slo(expect={"p99_ms": "< 3x baseline", "error_rate": "<= 0.01", "sent": "10..20", "ok": "~ ^5$"})
    probe = Scripted(spec, [{"p99_ms": 40, "error_rate": 0.0, "sent": 12, "ok": 5},
                            {"p99_ms": 130, "error_rate": 0.0, "sent": 25, "ok": 5}])
    b = Baselines()
    before = sample(probe, "before", b)
    j = before.judgement("p99_ms")
    assert (j.value, j.rule, j.threshold, j.baseline, j.outcome) == (40, "< 3x baseline", None, 40.0, "ok")
    during = sample(probe, "during", b)
    by_key = {j.key: j for j in during.judgements}
    assert list(by_key) == ["p99_ms", "error_rate", "sent", "ok"]  # the order of expect
    p99 = by_key["p99_ms"]
    assert (p99.value, p99.threshold, p99.baseline, p99.outcome) == (130, 120.0, 40.0, "fail")
    assert p99.bound() == "< 3x baseline = 120" and p99.bounds() == [(120.0, "< 3x baseline = 120")]
    assert (by_key["error_rate"].threshold, by_key["error_rate"].outcome) == (0.01, "ok")
    assert (by_key["sent"].low, by_key["sent"].high, by_key["sent"].outcome) == (10.0, 20.0, "fail")
    assert by_key["ok"].threshold is None and by_key["ok"].ok
    assert during.verdict == "fail"
    # the words older readers read say the same, failing keys first
    assert during.details == [f"{j.key}: {j.why}" for j in during.judgements if not j.ok] + [
        f"{j.key}: {j.why}" for j in during.judgements if j.ok]
    assert from_json(json.loads(json.dumps(during.to_json()))).judgements == during.judgements


def test_no_baseline_fails_later_samples_with_the_reason():
    spec = slo(expect={"p99_ms": "< 3x baseline"})
    errored = Baselines()
    probe = Scripted(spec, [RuntimeError("connection refused"), {"p99_ms": 1.0}])
    assert sample(probe, "before", errored).verdict == "error"
    s = sample(probe, "during", errored)
    assert s.verdict == "fail"
    assert s.details == ["p99_ms: 1.0 < 3x baseline: no baseline: the before sample of p was an error "
                         "(RuntimeError: connection refused)"]

    missing = Baselines()
    probe = Scripted(spec, [{"ok": 0}, {"p99_ms": 1.0}])
    before = sample(probe, "before", missing)
    assert before.verdict == "fail" and before.details == ["p99_ms: not measured"]
    assert sample(probe, "after", missing).details == [
        "p99_ms: 1.0 < 3x baseline: no baseline: p99_ms was not measured in the before phase"]

    never = Baselines()
    assert "p was not sampled in the before phase" in sample(Scripted(spec, [{"p99_ms": 1.0}]), "during",
                                                              never).details[0]
    assert sample(Scripted(spec, [{"p99_ms": 1.0}]), "during", None).verdict == "fail"

    nan = Baselines()
    probe = Scripted(spec, [{"p99_ms": float("nan")}, {"p99_ms": 1.0}])
    assert sample(probe, "before", nan).verdict == "fail"  # NaN cannot be a baseline
    assert "not a number" in sample(probe, "during", nan).details[0]


def test_fixed_tolerances_do_not_need_a_baseline():
    s = sample(Scripted(slo(expect={"p99_ms": "< 950"}), [{"p99_ms": 12.0}]), "during", None)
    assert s.verdict == "ok" and s.details == ["p99_ms: 12 < 950"]


def test_validation_errors_name_the_field():
    with pytest.raises(ValidationError, match=r"expect\.p99_ms: '< 3x baseline' compares with this probe's "
                                              r"p99_ms in the before phase, but its phases \(during, after\)"):
        slo(phases=["during", "after"], expect={"p99_ms": "< 3x baseline"})
    with pytest.raises(ValidationError, match="multiplied by numbers"):
        slo(expect={"p99_ms": "< baseline * baseline"})
    with pytest.raises(ValidationError, match="names a group, but the probe has no group_by"):
        slo(expect={"p99_ms[a]": "< 950"})
    with pytest.raises(ValidationError, match="'late_share' is not measured per group"):
        slo(group_by="X-R", expect={"late_share[a]": "< 1"})
    with pytest.raises(ValidationError, match="'p98_ms' is not measured per group"):
        slo(group_by="X-R", expect={"p98_ms[a]": "< 1"})
    with pytest.raises(ValidationError, match="native sender .* does not read response headers"):
        slo(group_by="X-R", load={**LOAD, "sender": "native"})
    with pytest.raises(ValidationError, match="group_by"):
        slo(group_by="not a header")
    ok = slo(group_by="X-Upstream-Replica", expect={"p99_ms[triton-0]": "< 3x baseline", "requests[b]": "> 0",
                                                    "error_rate[none]": "== 0", "p99_ms": "< 950"})
    assert ok.expected_groups() == {"triton-0", "b", "none"}


EXP = """\
apiVersion: chaoskit/v1
kind: Experiment
metadata: {{name: t}}
steadyState:
  probes:
    - name: slo
      type: slo
{extra}      load: {{url: "http://127.0.0.1:9/", rate: 5, duration: 1s}}
      expect: {{p99_ms: "{tol}"}}
method:
  - pause: 1s
{guards}"""


def load(tmp_path: Path, tol: str, extra: str = "", guards: str = ""):
    f = tmp_path / "e.yaml"
    f.write_text(EXP.format(tol=tol, extra=extra, guards=guards))
    return load_experiment(f)


def test_experiment_files(tmp_path):
    exp = load(tmp_path, "< 3x baseline").experiment
    assert exp.steady_state.probes[0].expect["p99_ms"].relative
    with pytest.raises(SpecError, match=r"e\.yaml:9:\d+: .*p99_ms.*'< 3x baseline \*': the expression ends too early"):
        load(tmp_path, "< 3x baseline *")
    with pytest.raises(SpecError, match="leave out before"):
        load(tmp_path, "< 3x baseline", extra="      phases: [during]\n")
    with pytest.raises(SpecError, match=r"safeguards\[0\]\.abort_when.*safeguard rules compare with fixed numbers"):
        load(tmp_path, "< 950", guards="safeguards:\n  - probe: slo\n    abort_when: 'p99_ms > 3x baseline'\n")


def test_groups_record_merge_and_summarise():
    a, b = Recorder(), Recorder()
    for _ in range(100):
        a.sent_at(0)
        a.success(0.010, 0.010, None, [], 1, True)
        a.group("triton-0").success(0.010, 0.010, None, [], 1, True)
        b.sent_at(0)
        b.success(0.200, 0.200, None, [], 1, False)
        b.group("triton-1").success(0.200, 0.200, None, [], 1, False)
    a.failure("timeout")
    a.group(None).failure("timeout")  # no header: group none
    total = Recorder()
    total.merge(a.to_json())
    total.merge(b.to_json())
    s = total.summary(200, 1.0, scheduled=200)
    assert s["requests"] == 201 and s["requests[triton-0]"] == 100 and s["requests[triton-1]"] == 100
    assert s["requests[none]"] == 1 and s["error_rate[none]"] == 1.0 and "p99_ms[none]" not in s
    assert abs(s["p99_ms[triton-0]"] - 10) < 0.1 and abs(s["p99_ms[triton-1]"] - 200) < 0.5
    assert s["error_rate[triton-0]"] == 0.0 and s["goodput_rps[triton-1]"] == 0.0
    assert "sent[triton-0]" not in s and "achieved_rps[triton-0]" not in s  # a send has no group yet
    total.reset()
    assert total.groups == {} and "requests[triton-0]" not in total.summary(1, 1, scheduled=1)


def test_group_names_are_capped_and_sanitised():
    rec = Recorder()
    for i in range(MAX_GROUPS + 10):
        rec.group(f"req-{i}").failure("http_status")
    rec.group(None).failure("connect")
    assert len(rec.groups) == MAX_GROUPS + 2  # the first MAX_GROUPS values, `other`, and `none`
    assert rec.groups["other"].errors == {"http_status": 10} and rec.groups["none"].errors == {"connect": 1}
    assert rec.group("req-1") is rec.groups["req-1"] and rec.group("new") is rec.groups["other"]
    assert rec.group("") is rec.groups["none"] and rec.group("  ") is rec.groups["none"]
    fresh = Recorder()
    assert fresh.group(" a[1] ") is fresh.groups["a(1)"]  # brackets would break the KEY[group] names
    assert fresh.group("x" * 100) is fresh.groups["x" * 64]


def test_the_fast_client_captures_the_header_from_the_response_head():
    from chaoskit.load.fastclient import group_header

    results: list[Outcome] = []

    class T:
        def write(self, _: bytes) -> None: ...
        def is_closing(self) -> bool: return False
        def close(self) -> None: ...

    for head, want in [(b"HTTP/1.1 200 OK\r\nx-upstream-replica:  Triton-0 \r\nContent-Length: 2\r\n\r\nok",
                        "Triton-0"),
                       (b"HTTP/1.1 502 Bad Gateway\r\nContent-Length: 0\r\nX-Upstream-Replica: b\r\n\r\n", "b"),
                       (b"HTTP/1.1 200 OK\r\nX-Other: a\r\nContent-Length: 0\r\n\r\n", None)]:
        conn = _Conn(group_header("X-Upstream-Replica"))
        conn.connection_made(T())  # type: ignore[arg-type]
        conn.start(b"GET / HTTP/1.1\r\n\r\n", "http", False, results.append, 1e18)
        conn.data_received(head)
        assert results[-1].group == want
    assert results[1].error == "http_status"


def test_group_by_chooses_the_python_sender():
    spec = LoadSpec(url="http://127.0.0.1:9/", rate=1, duration=1)
    assert native.choose(spec, "X-Upstream-Replica") == "python"
    with pytest.raises(ChaoskitError, match="needs the python sender"):
        native.choose(spec.model_copy(update={"sender": "native"}), "X-Upstream-Replica")


def test_the_slo_probe_says_why_a_percentile_is_missing():
    from chaoskit.probes.slo import SloProbe

    probe = SloProbe(slo(group_by="X-R", expect={"p99_ms[b]": "< 950"}))
    assert probe.missing("p99_ms[b]", {"requests[b]": 3, "ok[b]": 0}) == \
        "not measured: no answer from b completed successfully in this sample (requests[b] 3, ok[b] 0)"
    assert probe.missing("ttft_p99_ms", {"requests": 5, "ok": 0}) == \
        "not measured: no answer completed successfully in this sample (requests 5, ok 0)"
    assert probe.missing("error_rate[c]", {}) == "not measured"
    s = sample(Scripted(slo(group_by="X-R", expect={"p99_ms[b]": "< 950"}), [{"requests[b]": 0}]), "during", None)
    assert s.details == ["p99_ms[b]: not measured"]  # a Probe that does not know says just that
