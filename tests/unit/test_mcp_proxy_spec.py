"""mcp.proxy: its spec's validation errors (also as file:line from an experiment, exit 2), the wire format and the
plan's words, and the fault table's pure parts: what a request is to matching, the seeded share draws, which
fault wins, sessions forgotten, tools taken out of a tools/list result."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from pydantic import ValidationError

from chaoskit.experiment.schema import experiment_schema
from chaoskit.injectors.mcp_proxy.fault import McpProxy, McpProxySpec
from chaoskit.injectors.mcp_proxy.faults import Call, FaultTable, McpStats, change_tools
from tests.conftest import chaoskit


def spec(faults: list[dict] | None = None, **kw) -> McpProxySpec:
    return McpProxySpec.model_validate({"type": "mcp.proxy", "listen": "127.0.0.1:18090",
                                        "upstream": "http://127.0.0.1:8004/mcp", "faults": faults or [], **kw})


@pytest.mark.parametrize("faults, kw, message", [
    ([{"type": "error", "share": 1.5}], {}, "share is a fraction 0..1 or a percentage like '20%' (got 1.5)"),
    ([{"type": "error", "share": "most"}], {}, "expected a fraction 0..1 or a percentage"),
    ([{"type": "error", "message": ""}], {}, "at least 1 character"),
    ([{"type": "error", "code": "bad"}], {}, "valid integer"),
    ([{"type": "error", "status": 500}], {}, "Extra inputs are not permitted"),
    ([{"type": "delay"}], {}, "Field required"),
    ([{"type": "delay", "delay": "100ms", "jitter": "200ms"}], {}, "jitter (0.2s) is larger than delay"),
    ([{"type": "delay", "delay": 0}], {}, "greater than 0"),
    ([{"type": "timeout", "after": "1s"}], {}, "Extra inputs are not permitted"),
    ([{"type": "sse_cut", "after_events": -1}], {}, "greater than or equal to 0"),
    ([{"type": "session_lost", "match": {"tool": []}}], {}, "at least 1 item"),
    ([{"type": "error", "match": {"method": ["tools call"]}}], {}, "expected a glob without spaces"),
    ([{"type": "error", "match": {"path": "/mcp"}}], {}, "Extra inputs are not permitted"),
    ([{"type": "tools_change"}], {}, "Field required"),
    ([{"type": "tools_change", "remove": ["x"], "match": {"method": ["tools/call"]}}], {},
     "match.method must include tools/list"),
    ([{"type": "restart"}], {}, "'error', 'delay', 'timeout', 'sse_cut', 'session_lost', 'tools_change'"),
    ([{"type": "timeout"}, {"type": "error", "name": "timeout-0"}], {}, "faults[1]: name 'timeout-0' is used twice"),
    ([], {"upstream": "https://127.0.0.1:8004/mcp"}, "the proxy speaks plain HTTP/1.1 to its upstream"),
    ([], {"upstream": "127.0.0.1:18090"}, "listen and upstream are the same address"),
    ([], {"listen": "localhost"}, "expected host:port (got 'localhost')"),
    ([], {"upstream": None}, "upstream required (or intercept"),
    ([], {"intercept": {"port": 8004, "target": {"netns": "x"}}}, "listens on every address of the namespace"),
    ([], {"listen_tls": {"cert_file": "c", "key_file": "k"}}, "Extra inputs are not permitted"),
])
def test_invalid_specs(faults, kw, message):
    with pytest.raises(ValidationError) as e:
        spec(faults, **kw)
    assert message in str(e.value)


def test_wire_format_defaults_and_the_plan():
    s = spec([{"type": "error", "share": "20%", "code": -32602, "match": {"tool": ["get_*"]}},
              {"type": "session_lost", "name": "restart", "share": 0.3},
              {"type": "tools_change", "remove": ["slow_*"]},
              {"type": "delay", "delay": "250ms", "match": {"method": ["tools/*", "resources/read"]}}], seed=9)
    w = s.wire()
    assert w["seed"] == 9 and [f["name"] for f in w["faults"]] == ["error-0", "restart", "tools_change-2", "delay-3"]
    assert [f["match"] for f in w["faults"]] == [
        {"method": ["tools/call"], "tool": ["get_*"]}, {"method": ["tools/call"], "tool": None},
        {"method": ["tools/list"], "tool": None}, {"method": ["tools/*", "resources/read"], "tool": None}]
    assert w["faults"][0]["share"] == pytest.approx(0.2) and w["faults"][3]["params"]["delay"] == pytest.approx(0.25)
    assert s.upstream == "127.0.0.1:8004" and spec(upstream="http://mcp-host").upstream == "mcp-host:80"
    plan = " ".join(McpProxy(s).plan())
    assert "start an MCP proxy 127.0.0.1:18090 -> 127.0.0.1:8004 (seed 9)" in plan
    assert "error-0: answer JSON-RPC error -32602 ('mcp.proxy: injected error') on 20% of tools/call requests " \
           "naming get_*" in plan
    assert "restart: forget the request's Mcp-Session-Id (404 to it from then on) on 30% of tools/call" in plan
    assert "tools_change-2: remove slow_* from tools/list answers on 100% of tools/list requests" in plan


def test_an_experiments_error_names_file_line_and_field_and_exits_2(tmp_path: Path):
    f = tmp_path / "e.yaml"
    f.write_text("""apiVersion: chaoskit/v1
kind: Experiment
metadata: {name: bad-mcp-proxy}
steadyState:
  probes: [{name: t, type: command, argv: ["true"]}]
method:
  - inject:
      type: mcp.proxy
      listen: "127.0.0.1:18090"
      upstream: "http://127.0.0.1:8004/mcp"
      faults:
        - {type: session_lost}
        - {type: sse_cut, after_events: many}
    duration: 5s
""")
    p = chaoskit("validate", str(f), state=tmp_path)
    out, err = p.communicate(timeout=60)
    assert p.returncode == 2, out + err
    assert "e.yaml:13:" in err and "method[0].inject.faults[1].after_events" in err and "valid integer" in err
    assert "Traceback" not in err


def test_every_field_of_the_published_schema_has_a_description():
    defs = experiment_schema()["$defs"]
    for name in ("McpProxySpec", "McpMatch", "McpErrorFault", "McpDelayFault", "McpTimeoutFault", "McpSseCutFault",
                 "McpSessionLostFault", "McpToolsChangeFault"):
        missing = [k for k, v in defs[name]["properties"].items() if k != "type" and not v.get("description")]
        assert not missing, f"{name}: fields without a description: {missing}"


# ---------------------------------------------------------------- the fault table

def body(method: str, tool: str | None = None, call_id: object = 1) -> bytes:
    msg: dict = {"jsonrpc": "2.0", "method": method}
    if call_id is not None:
        msg["id"] = call_id
    if tool is not None:
        msg["params"] = {"name": tool, "arguments": {}}
    return json.dumps(msg).encode()


def test_what_a_request_is_to_matching():
    assert Call.of(body("tools/call", "get_time", 7), "s1") == Call("tools/call", 7, "get_time", "s1")
    assert Call.of(body("tools/list"), None) == Call("tools/list", 1, None, None)
    assert Call.of(body("notifications/initialized", call_id=None), "s1") == Call(None, None, None, "s1")  # no id
    assert Call.of(b"", "s1") == Call.of(b"{not json", "s1") == Call.of(b"[1, 2]", "s1") == Call(None, None, None, "s1")
    assert Call.of(body("resources/read", "x"), None).tool is None  # a name only counts on tools/call


def table(faults: list[dict], seed: int = 4) -> FaultTable:
    return FaultTable(spec(faults, seed=seed).wire()["faults"], seed)


def picks(seed: int, n: int = 200) -> list[int]:
    t = table([{"type": "error", "share": 0.3}], seed)
    return [i for i in range(n) if t.plan(Call.of(body("tools/call", "t"), None)) is not None]


def test_share_draws_are_reproducible_by_seed_and_near_the_share():
    assert picks(4) == picks(4) and picks(4) != picks(5)
    assert 40 <= len(picks(4)) <= 80


def test_matching_by_method_and_tool_and_which_fault_wins():
    t = table([{"type": "delay", "delay": "1s", "name": "slow"},
               {"type": "error", "name": "bad", "match": {"tool": ["get_time"]}},
               {"type": "timeout", "name": "hang", "match": {"tool": ["get_*"]}},
               {"type": "sse_cut", "name": "cut", "match": {"method": ["*"]}}])
    p = t.plan(Call.of(body("tools/call", "get_time"), None))
    assert p is not None and p.names == ["slow", "bad", "hang", "cut"] and p.local.name == "bad"
    assert p.delay.name == "slow" and p.delay_s == 1.0 and p.sse_cut is None  # drawn after the local answer
    p = t.plan(Call.of(body("tools/call", "get_weather"), None))
    assert p.local.name == "hang"
    p = t.plan(Call.of(body("tools/list"), None))
    assert p.names == ["cut"] and p.local is None and p.sse_cut.name == "cut"
    assert t.plan(Call.of(body("notifications/initialized", call_id=None), None)) is None
    counts = t.stats(4, 0).faults
    assert [(c.matched, c.selected) for c in counts.values()] == [(2, 2), (1, 1), (2, 2), (3, 3)]


def test_a_session_is_forgotten_only_where_there_is_one():
    t = table([{"type": "session_lost", "name": "restart"}])
    assert t.plan(Call.of(body("tools/call", "x"), None)) is None  # the stateless protocol: no session to forget
    p = t.plan(Call.of(body("tools/call", "x"), "s1"))
    assert p.local.type == "session_lost" and not t.lost("s1")  # the server forgets it when it answers
    t.forget("s1")
    assert t.lost("s1") and not t.lost("s2") and not t.lost(None)
    s = t.stats(2, 0)
    assert McpStats.from_json(json.loads(json.dumps(s.to_json()))) == s and s.sessions_forgotten == 1


def test_tools_taken_out_of_a_tools_list_result():
    f = table([{"type": "tools_change", "remove": ["slow_*", "get_time"]}]).faults[0]
    msg = {"jsonrpc": "2.0", "id": 2, "result": {"tools": [{"name": "get_weather"}, {"name": "get_time"},
                                                          {"name": "slow_lookup"}]}}
    assert change_tools(msg, f) and msg["result"]["tools"] == [{"name": "get_weather"}]
    assert not change_tools(msg, f)  # nothing more to remove
    assert not change_tools({"jsonrpc": "2.0", "id": 3, "error": {"code": 1, "message": "m"}}, f)
