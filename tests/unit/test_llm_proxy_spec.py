"""llm.proxy: its spec's validation errors (also as file:line from an experiment), the wire format, the seeded
share draws, chunked framing under arbitrary cuts, and the load side: how answers are classified, and which
specs need the python sender."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
from pydantic import ValidationError

from chaoskit.errors import ChaoskitError
from chaoskit.experiment.loader import load_experiment
from chaoskit.experiment.schema import experiment_schema
from chaoskit.injectors.llm_proxy.fault import GENERATE_PATHS, LlmProxy, LlmProxySpec
from chaoskit.injectors.llm_proxy.faults import FaultTable, Request
from chaoskit.injectors.llm_proxy.sse import Chunked, ChunkedEnd, corrupt_event, replace_text
from chaoskit.load import native
from chaoskit.load.clients import MalformedEvent, error_body, scan_stream, status_error
from chaoskit.load.recorder import ERROR_KINDS, PYTHON_ONLY_KINDS
from chaoskit.load.spec import LoadSpec
from chaoskit.probes.slo import SloProbeSpec
from tests.conftest import chaoskit


def spec(faults: list[dict] | None = None, **kw) -> LlmProxySpec:
    return LlmProxySpec.model_validate({"type": "llm.proxy", "listen": "127.0.0.1:18090",
                                        "upstream": "http://127.0.0.1:8000", "faults": faults or [], **kw})


@pytest.mark.parametrize("faults, kw, message", [
    ([{"type": "abort", "share": 1.5}], {}, r"share is a fraction 0..1 or a percentage like '20%' \(got 1.5\)"),
    ([{"type": "abort", "share": "150%"}], {}, "share is a fraction 0..1"),
    ([{"type": "abort", "share": "most"}], {}, "expected a fraction 0..1 or a percentage"),
    ([{"type": "abort", "share": True}], {}, "expected a fraction 0..1"),
    ([{"type": "abort", "status": 200}], {}, "greater than or equal to 400"),
    ([{"type": "abort", "status": 600}], {}, "less than or equal to 599"),
    ([{"type": "abort", "retry_after": -1}], {}, "greater than or equal to 0"),
    ([{"type": "abort", "retry_after": "1s"}], {}, "valid integer"),
    ([{"type": "delay"}], {}, "Field required"),
    ([{"type": "delay", "delay": "100ms", "jitter": "200ms"}], {}, r"jitter \(0.2s\) is larger than delay"),
    ([{"type": "token_delay", "delay": 0}], {}, "greater than 0"),
    ([{"type": "token_delay", "delay": "10ms", "jitter": "20ms"}], {}, "a uniform gap would be negative"),
    ([{"type": "token_delay", "delay": "10ms", "jitter": "2ms", "distribution": "exponential"}], {},
     "exponential has one parameter"),
    ([{"type": "token_delay", "delay": "10ms", "distribution": "pareto"}], {}, "'uniform', 'normal' or 'exponential'"),
    ([{"type": "stall"}], {}, "after_tokens"),
    ([{"type": "stall", "after_tokens": -1, "duration": "1s"}], {}, "greater than or equal to 0"),
    ([{"type": "truncate", "after_tokens": 2, "duration": "1s"}], {}, "Extra inputs are not permitted"),
    ([{"type": "malformed", "corrupt": "garbled"}], {}, "'bad_json', 'missing_data' or 'error_object'"),
    ([{"type": "truncate", "after_tokens": 2, "clean": "maybe"}], {}, "valid boolean"),
    ([{"type": "corrupt_tokens", "token_share": "101%"}], {}, "share is a fraction 0..1"),
    ([{"type": "corrupt_tokens", "text": ""}], {}, "at least 1 character"),
    ([{"type": "rate_limit"}], {}, "exactly one of requests_per_s or tokens_per_s"),
    ([{"type": "rate_limit", "requests_per_s": 5, "tokens_per_s": 50}], {}, "exactly one of requests_per_s"),
    ([{"type": "rate_limit", "requests_per_s": 0}], {}, "greater than 0"),
    ([{"type": "rate_limit", "requests_per_s": 5, "key": "ip"}], {}, "should match pattern"),
    ([{"type": "rate_limit", "requests_per_s": 5, "key": "header:"}], {}, "should match pattern"),
    ([{"type": "rate_limit", "requests_per_s": 5, "burst": 0.5}], {}, "greater than or equal to 1"),
    ([{"type": "tool_args"}], {}, "mode\n  Field required"),
    ([{"type": "tool_args", "mode": "garble"}], {}, "'cut', 'invalid_json', 'bad_escape', 'wrong_tool_name', "
                                                    "'duplicate_call' or 'finish_stop'"),
    ([{"type": "tool_args", "mode": "cut", "after_tokens": 2}], {}, "Extra inputs are not permitted"),
    ([{"type": "error_event", "after_tokens": -1}], {}, "greater than or equal to 0"),
    ([{"type": "error_event", "code": 200}], {}, "greater than or equal to 400"),
    ([{"type": "error_event", "message": ""}], {}, "at least 1 character"),
    ([{"type": "error_event", "done": "perhaps"}], {}, "valid boolean"),
    ([{"type": "schema_break", "mode": "shuffle"}], {}, "'drop_required' or 'wrong_type'"),
    ([{"type": "schema_break", "share": "120%"}], {}, "share is a fraction 0..1"),
    ([{"type": "abort", "name": "x"}, {"type": "truncate", "after_tokens": 1, "name": "x"}], {},
     "faults\\[1\\]: name 'x' is used twice"),
    ([{"type": "abort", "name": "has space"}], {}, "should match pattern"),
    ([{"type": "explode"}], {}, "does not match any of the expected tags"),
    ([{"type": "abort", "match": {"modle": "x"}}], {}, "Extra inputs are not permitted"),
    ([], {"upstream": "ftp://api.example.com"}, "the proxy speaks HTTP/1.1 to its upstream"),
    ([], {"upstream": "127.0.0.1:8000", "upstream_tls": {}}, "upstream_tls goes with an https:// upstream"),
    ([], {"listen": ":9000", "intercept": {"port": 8000, "target": {"netns": "x"}}}, "drop upstream"),
    ([], {"intercept": {"port": 8000, "target": {"netns": "x"}}}, "listens on every address of the namespace"),
    ([], {"upstream": "http://127.0.0.1:8000/v1"}, "expected no path in the upstream URL"),
    ([], {"upstream": "127.0.0.1:18090"}, "listen and upstream are the same address"),
    ([], {"listen": "localhost"}, r"expected host:port \(got 'localhost'\)"),
    ([], {"listen": "127.0.0.1:70000"}, "port 70000 is out of range"),
    ([], {"seed": "lucky"}, "valid integer"),
])
def test_invalid_specs(faults, kw, message):
    with pytest.raises(ValidationError, match=message):
        spec(faults, **kw)


def test_wire_format_fractions_names_defaults():
    s = spec([{"type": "abort", "share": "20%", "retry_after": 1},
              {"type": "abort", "share": 0.05, "name": "few", "match": {"path": "/v1/*", "model": "llama-*"}},
              {"type": "token_delay", "delay": "20ms", "jitter": "5ms"},
              {"type": "stall", "after_tokens": 4}], seed=9)
    w = s.wire()
    assert w["seed"] == 9 and [f["name"] for f in w["faults"]] == ["abort-0", "few", "token_delay-2", "stall-3"]
    assert w["faults"][0]["share"] == pytest.approx(0.2) and w["faults"][1]["share"] == pytest.approx(0.05)
    assert w["faults"][0]["match"]["path"] == list(GENERATE_PATHS) and w["faults"][1]["match"]["path"] == ["/v1/*"]
    assert w["faults"][2]["params"] == {"delay": pytest.approx(0.02), "jitter": pytest.approx(0.005),
                                        "distribution": "uniform"}
    assert w["faults"][3]["params"] == {"after_tokens": 4, "duration": 0}
    assert spec(upstream="http://[::1]:9000").upstream == "[::1]:9000"
    assert spec(upstream="http://gw").upstream == "gw:80"
    plan = " ".join(LlmProxy(s).plan())
    assert "abort-0: answer 503 with Retry-After: 1 on 20% of matching requests" in plan
    assert "stall-3: stop after 4 tokens for as long as the client waits" in plan


def test_errors_in_an_experiment_name_file_line_and_field(tmp_path: Path):
    f = tmp_path / "e.yaml"
    f.write_text("""apiVersion: chaoskit/v1
kind: Experiment
metadata: {name: bad-proxy}
steadyState:
  probes: [{name: t, type: command, argv: ["true"]}]
method:
  - inject:
      type: llm.proxy
      listen: "127.0.0.1:18090"
      upstream: "http://127.0.0.1:8000"
      faults:
        - {type: rate_limit, requests_per_s: 5, tokens_per_s: 5}
    duration: 5s
""")
    with pytest.raises(ChaoskitError) as e:
        load_experiment(f)
    assert "e.yaml:12" in str(e.value) and "exactly one of requests_per_s or tokens_per_s" in str(e.value)
    f.write_text(f.read_text().replace("{type: rate_limit, requests_per_s: 5, tokens_per_s: 5}",
                                       "{type: error_event, after_tokens: 2}\n        - {type: tool_args, mode: chop}"))
    with pytest.raises(ChaoskitError) as e:
        load_experiment(f)
    assert str(e.value).endswith("e.yaml:13:29: method[0].inject.faults[1].mode: Input should be 'cut', "
                                 "'invalid_json', 'bad_escape', 'wrong_tool_name', 'duplicate_call' or 'finish_stop'")


def test_every_field_of_the_published_schema_has_a_description():
    defs = experiment_schema()["$defs"]
    for name in ("LlmProxySpec", "Match", "AbortFault", "DelayFault", "TokenDelayFault", "StallFault",
                 "TruncateFault", "MalformedFault", "RateLimitFault", "CorruptTokensFault", "ToolArgsFault",
                 "ErrorEventFault", "SchemaBreakFault"):
        missing = [k for k, v in defs[name]["properties"].items() if k != "type" and not v.get("description")]
        assert not missing, f"{name}: fields without a description: {missing}"


# ---------------------------------------------------------------- the server's pure parts

def _req(path: str = "/v1/completions", body: bytes = b'{"model": "m"}', head: bytes = b"") -> Request:
    return Request(b"POST", path, b"POST " + path.encode() + b" HTTP/1.1\r\n" + head + b"\r\n", body, "127.0.0.1")


def _picks(seed: int, n: int = 200) -> list[int]:
    t = FaultTable(spec([{"type": "abort", "share": 0.3}], seed=seed).wire()["faults"], seed)
    return [i for i in range(n) if t.plan(_req()) is not None]


def test_share_draws_are_reproducible_by_seed_and_near_the_share():
    assert _picks(4) == _picks(4) and _picks(4) != _picks(5)
    assert 40 <= len(_picks(4)) <= 80


def test_a_fault_draws_only_for_requests_it_matches():
    faults = spec([{"type": "abort", "share": 0.5, "match": {"headers": {"X-Tenant": "b*"}, "model": "m"}}]).wire()
    t = FaultTable(faults["faults"], 0)
    for _ in range(10):
        t.plan(_req(head=b"X-Tenant: a\r\n"))
        t.plan(_req("/v2/health/ready"))
        t.plan(_req(body=b'{"model": "other"}', head=b"x-tenant: bob\r\n"))
    assert t.faults[0].matched == 0
    t.plan(_req(head=b"x-tenant: bob\r\n"))
    assert t.faults[0].matched == 1


def test_chunked_framing_under_arbitrary_cuts():
    events = [b'data: {"text":"t%d"}\n\n' % i for i in range(40)]
    body = b"".join(b"%x;ext=1\r\n%b\r\n" % (len(e), e) for e in events) + b"0\r\nX-Trailer: 1\r\n\r\n"
    rnd = random.Random(1)
    for _ in range(300):
        cuts = sorted(rnd.sample(range(1, len(body)), rnd.randint(0, 30)))
        c, got, end = Chunked(), [], -1
        for a, b in zip([0, *cuts], [*cuts, len(body)], strict=True):
            parts, end = c.feed(body[a:b], collect=True)
            got += parts
        assert end == len(body) - cuts[-1] if cuts else end == len(body)
        assert b"".join(got) == b"".join(events)
    assert Chunked().feed(body + b"GET / HTTP/1.1")[1] == len(body)  # where the next request starts


def test_a_relayed_chunked_body_ends_where_its_last_chunk_and_trailer_do():
    """ChunkedEnd (llhttp): under arbitrary cuts it says `ended` exactly at the feed holding the body's last byte;
    broken framing is a ValueError, bytes after the end are not."""
    body = b"".join(b"%x;ext=1\r\n%b\r\n" % (len(e), e) for e in (b"data: 0\n\n", b"x" * 300, b"\r\n0\r\n\r\n"))
    body += b"3 ;ext=2\r\nabc\r\n0\r\nX-Trailer: 1\r\n\r\n"  # spaces before an extension: as Chunked takes it
    rnd = random.Random(2)
    for _ in range(300):
        cuts = sorted(rnd.sample(range(1, len(body)), rnd.randint(0, 30)))
        c = ChunkedEnd()
        said = [c.feed(body[a:b]) for a, b in zip([0, *cuts], [*cuts, len(body)], strict=True)]
        assert said == [False] * len(cuts) + [True]
    for after in (b"HTTP/1.1 garbage", b"HTTP/1.1 200 OK\r\n", b"x"):  # bytes after the end: noted, not an error
        c = ChunkedEnd()
        assert c.feed(body) and not c.extra and c.feed(after) and c.extra
        c = ChunkedEnd()
        assert c.feed(body + after) and c.extra
    for bad in (b"zz\r\nabc\r\n", b"3\r\nabcdef\r\n"):
        with pytest.raises(ValueError, match="bad chunked framing"):
            ChunkedEnd().feed(bad)


def test_corruptions_are_what_the_client_calls_malformed():
    ev = b'data: {"text_output":"t"}\n\n'
    for how in ("bad_json", "missing_data"):
        with pytest.raises(MalformedEvent):
            scan_stream("triton", corrupt_event(ev, how))
    assert corrupt_event(ev, "bad_json") == b'data: {"text_output":"t"\n\n'
    assert corrupt_event(ev, "missing_data") == b'{"text_output":"t"}\n\n'


def test_corrupt_tokens_replaces_each_api_s_token_text_and_keeps_the_json_valid():
    events = {b'data: {"choices":[{"index":0,"text":"Par","finish_reason":null}]}\n\n': ("choices", 0, "text"),
              b'data: {"choices":[{"delta":{"content":"is"}}]}\n\n': ("choices", 0, "delta", "content"),
              b'data: {"text_output":"#","model_name":"tiny_lm_stream"}\n\n': ("text_output",)}
    for ev, path in events.items():
        out = replace_text(ev, "#")
        assert out is not None and out.startswith(b"data: ") and out.endswith(b"\n\n")
        doc = json.loads(out[6:])
        for key in path:
            doc = doc[key]
        assert doc == ("##" if b'"#"' in ev else "#")  # always different from the token's own text
    assert replace_text(b"data: [DONE]\n\n", "#") is None  # no token: left as it is
    assert replace_text(b'data: {"choices":[{"text":""}]}\n\n', "#") is None
    assert replace_text(b"data: {bad\n\n", "#") is None


# ---------------------------------------------------------------- the load side

@pytest.mark.parametrize("status, retry_after, kind", [
    (429, False, "rate_limited"), (429, True, "rate_limited_retry_after"), (503, True, "unavailable_retry_after"),
    (503, False, "http_status"), (500, True, "http_status"), (404, False, "http_status")])
def test_status_classes(status, retry_after, kind):
    assert status_error(status, retry_after) == kind and kind in ERROR_KINDS


def test_stream_checks():
    ok = b'data: {"choices":[{"text":"a"}]}\n\n: keep-alive\n\nevent: x\nid: 1\ndata: [DONE]\n\n'
    assert scan_stream("openai", ok) == (1, None, True)
    with pytest.raises(MalformedEvent):
        scan_stream("openai", b"data: not json\n\n")
    with pytest.raises(MalformedEvent):
        scan_stream("openai", b'{"choices":[]}\n\n')
    with pytest.raises(ValueError, match="boom"):  # an error object: stream_error, not malformed
        scan_stream("openai", b'data: {"error": {"message": "boom"}}\n\n')
    assert error_body(b'{"error": "model not ready"}') and error_body(b' {"object": "error", "message": "x"}')
    assert not error_body(b'{"choices": [], "error_count": 0}')


def test_stall_timeout_needs_the_python_sender():
    base = {"url": "http://127.0.0.1:1", "rate": 1, "duration": 1, "stall_timeout": "500ms"}
    with pytest.raises(ValidationError, match="stall_timeout needs the python sender"):
        LoadSpec(**base, sender="native")
    assert LoadSpec(**base).stall_timeout == 0.5
    assert native.choose(LoadSpec(**base)) == "python"


def test_slo_expectations_on_kinds_pick_the_python_sender():
    def probe(expect: dict, sender: str = "auto") -> SloProbeSpec:
        return SloProbeSpec.model_validate({"name": "p", "type": "slo", "expect": expect, "load": {
            "url": "http://127.0.0.1:1", "api": "triton", "rate": 1, "duration": 1, "sender": sender}})

    assert probe({"error_share": {"stream_malformed": "< 0.1"}}).load.sender == "python"
    assert probe({"errors": {"timeout": "== 0"}}).load.sender == "auto"  # the native sender counts timeouts
    assert probe({"errors": {"stream_truncated": "== 0"}}).load.sender == "auto"  # and cut streams
    with pytest.raises(ValidationError, match="the native sender .* counts these as http_status or other"):
        probe({"errors": {"rate_limited": "== 0"}}, sender="native")
    with pytest.raises(ValidationError, match="unknown error kind \\(did you mean 'stream_stalled'\\?\\)"):
        probe({"errors": {"stream_staled": "== 0"}})
    assert set(PYTHON_ONLY_KINDS) < set(ERROR_KINDS)


def test_bundled_llm_experiments_validate():
    for f in sorted(Path(__file__).resolve().parents[2].glob("experiments/llm/*.yaml")):
        loaded = load_experiment(f, strict=False)
        assert loaded.experiment.method[0].inject.type == "llm.proxy", f
        assert json.dumps(loaded.experiment.method[0].inject.wire())


def test_cli_refuses_a_stall_timeout_with_the_native_sender(tmp_path: Path):
    p = chaoskit("load", "http://127.0.0.1:1", "--rate", "1", "--duration", "1s", "--stall-timeout", "1s",
                 "--sender", "native", state=tmp_path)
    out, err = p.communicate(timeout=60)
    assert p.returncode == 2 and "stall_timeout needs the python sender" in err


def test_the_redirect_falls_back_to_an_ip_table_where_inet_nat_is_refused(monkeypatch):
    """A kernel before 5.2 refuses NAT in an inet table (not here: this kernel takes it, see
    tests/integration/test_proxy_intercept.py): the redirect is then made in an ip table, IPv4 only."""
    from chaoskit.injectors.proxy import intercept as proxy_intercept
    from chaoskit.targets import nftables

    sent: list[set[str]] = []

    def run(ns: str, commands: list[dict]) -> dict:
        families = {c["add"][kind]["family"] for c in commands for kind in c["add"]}
        sent.append(families)
        if families == {"inet"}:
            raise nftables.NftError("Error: Could not process rule: Operation not supported")
        return {}

    monkeypatch.setattr(nftables, "run", run)
    assert proxy_intercept.add("/run/netns/x", "chaoskit_0123456789ab", 8000, 9000) == "ip"
    assert sent == [{"inet"}, {"ip"}]
