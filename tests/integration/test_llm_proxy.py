"""llm.proxy in front of the real reference deployment (Triton tiny_lm_stream behind the gateway; vLLM when
installed): each fault's exact effect on the wire, measured against a direct request in the same test; the
share draws reproducible by seed; what the load generator classifies equal to what the proxy says it did;
and no proxy process left after revert."""

from __future__ import annotations

import asyncio
import json
import re
import socket
import statistics
import threading
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import pytest

from chaoskit.injectors.llm_proxy.fault import LlmProxy, stats_of
from chaoskit.load.runner import run_load
from chaoskit.load.spec import LoadSpec
from chaoskit.probes.correctness import CorrectnessProbe, CorrectnessProbeSpec
from chaoskit.reference import vllm
from chaoskit.reference.deploy import Deployment, RefOptions
from chaoskit.targets.process import all_pids, cmdline
from tests.conftest import free_port, requires_triton, vllm_facts
from tests.helpers.sse_client import Answer, call, request_bytes

STREAM = "/v2/models/tiny_lm_stream/generate_stream"
GENERATE = "/v2/models/tiny_lm/generate"


def prompt(n: int = 12, text: str = "chaos") -> dict:
    return {"text_input": text, "max_tokens": n}


@pytest.fixture(scope="module")
def triton(tmp_path_factory):
    d = Deployment(tmp_path_factory.mktemp("llm-ref"))
    facts = d.up(RefOptions(port=18780, replicas=1), say=lambda _m: None)
    yield facts
    d.down(say=lambda _m: None)


def _start(upstream: str, faults: list[dict], seed: int = 0, port: int | None = None) -> tuple[int, dict]:
    port = port or free_port()
    inj = LlmProxy(LlmProxy.Spec(type="llm.proxy", listen=f"127.0.0.1:{port}", upstream=upstream, faults=faults,
                                 seed=seed))
    inj.ctx.lifetime_s = 300
    inj.preflight()
    return port, inj.apply(inj.prepare())


def _stop(rec: dict) -> None:
    LlmProxy.revert(rec)
    assert not LlmProxy.observe(rec)
    assert not [p for p in all_pids() if rec.token in cmdline(p)]


@pytest.fixture
def proxies():
    """start(upstream, [(faults, seed), ...]) -> their ports, started in parallel (each proxy is a process:
    ~1.5 s of Python start-up here); every one is reverted at the end, leaving no process."""
    started: list[dict] = []

    def start(upstream: str, configs: list[tuple[list[dict], int]]) -> list[int]:
        ports: list[int] = []
        while len(ports) < len(configs):  # distinct: free_port() from threads at once can answer one port twice
            if (port := free_port()) not in ports:
                ports.append(port)
        with ThreadPoolExecutor(len(configs)) as pool:
            out = list(pool.map(lambda c: _start(upstream, *c[0], port=c[1]), zip(configs, ports, strict=True)))
        started.extend(rec for _, rec in out)
        return [port for port, _ in out]

    yield start
    for rec in started:
        _stop(rec)


def by_header(faults: dict[str, dict]) -> list[dict]:
    """Faults each selected by a request header X-Fault: NAME (so one proxy serves every test of the module)."""
    return [{"name": name, **f, "match": {**f.get("match", {}), "headers": {"X-Fault": name}}}
            for name, f in faults.items()]


FAULTS = by_header({
    "storm": {"type": "abort", "status": 503, "retry_after": 1},
    "r429": {"type": "abort", "status": 429},
    "delay": {"type": "delay", "delay": "300ms"},
    "itl": {"type": "token_delay", "delay": "30ms"},
    "stall": {"type": "stall", "after_tokens": 3, "duration": "600ms"},
    "hang": {"type": "stall", "after_tokens": 2},
    "cut": {"type": "truncate", "after_tokens": 4},
    "clean_cut": {"type": "truncate", "after_tokens": 4, "clean": True},
    "garble": {"type": "corrupt_tokens", "text": "#"},
    "garble_some": {"type": "corrupt_tokens", "token_share": 0.5},
    "bad_json": {"type": "malformed", "corrupt": "bad_json", "after_tokens": 2},
    "missing_data": {"type": "malformed", "corrupt": "missing_data", "after_tokens": 2},
    "error_object": {"type": "malformed", "corrupt": "error_object", "after_tokens": 2},
    "rl": {"type": "rate_limit", "requests_per_s": 1, "burst": 2, "key": "header:X-Tenant"},
    "tl": {"type": "rate_limit", "tokens_per_s": 4, "burst": 4, "retry_after": False},
    "model": {"type": "abort", "status": 500, "match": {"model": "tiny_lm_stream"}},
}) + [{"type": "abort", "status": 502, "name": "canary",
       "match": {"path": "/v2/models/*/generate", "headers": {"X-Canary": "yes*"}}}]


@pytest.fixture(scope="module")
def px(triton):
    """The module's proxy in front of the gateway: FAULTS, each chosen by X-Fault."""
    port, rec = _start(triton["url"], FAULTS)
    yield port
    _stop(rec)


def via(px: int, fault: str | None, path: str = STREAM, body: object = None, **kw) -> Answer:
    headers = {**kw.pop("headers", {}), **({"X-Fault": fault} if fault else {})}
    return call(px, path, prompt() if body is None else body, headers=headers, **kw)


def gateway_requests(url: str) -> float:
    with urllib.request.urlopen(f"{url}/metrics", timeout=5) as r:
        text = r.read().decode()
    return sum(float(m) for m in re.findall(r'^gateway_requests_total\{[^}]*\} (\S+)$', text, re.M))


def gaps(a: Answer) -> list[float]:
    t = a.token_times()
    return [y - x for x, y in zip(t, t[1:], strict=False)]


pytestmark = requires_triton


# ---------------------------------------------------------------- no faults, abort, delay

def test_without_a_matching_fault_the_stream_is_the_upstreams(triton, px):
    direct = call(triton["gateway_port"], STREAM, prompt(8))
    through = via(px, None, body=prompt(8))
    assert through.status == 200 and through.complete and not through.closed
    assert through.events == direct.events and len(through.tokens()) == 8
    assert "x-chaoskit-fault" not in through.headers


def test_abort_answers_status_and_retry_after_without_the_upstream(triton, px):
    before = gateway_requests(triton["url"])
    a = via(px, "storm")
    b = via(px, "r429", GENERATE)
    assert (a.status, a.headers["retry-after"], a.headers["x-chaoskit-fault"]) == (503, "1", "storm")
    assert a.json() == {"error": "llm.proxy fault storm: HTTP 503"} and a.complete
    assert b.status == 429 and "retry-after" not in b.headers  # 429 without Retry-After
    assert gateway_requests(triton["url"]) == before  # neither reached the upstream


def test_delay_holds_the_request_before_forwarding(triton, px):
    # three interleaved pairs, medians: one slow direct call on a busy box (a CI run's 50 ms) is not the delay
    pairs = [(call(triton["gateway_port"], STREAM, prompt(4)), via(px, "delay", body=prompt(4))) for _ in range(3)]
    added = statistics.median(t.head_s for _, t in pairs) - statistics.median(d.head_s for d, _ in pairs)
    assert 0.29 <= added < 0.40, [(d.head_s, t.head_s) for d, t in pairs]
    assert all(len(t.tokens()) == 4 and t.complete for _, t in pairs)


# ---------------------------------------------------------------- token-level faults

def test_token_delay_adds_the_gap_between_tokens_not_before_the_first(triton, px):
    direct = [call(triton["gateway_port"], STREAM, prompt(10)) for _ in range(4)]
    through = [via(px, "itl", body=prompt(10)) for _ in range(4)]
    added = statistics.median(g for a in through for g in gaps(a)) - statistics.median(g for a in direct
                                                                                       for g in gaps(a))
    print(f"\ntoken_delay 30ms: added inter-token gap p50 {added * 1e3:.2f} ms")
    assert abs(added - 0.030) <= 0.003
    # TTFT not delayed (a delay before the first token too would add 30 ms): the fastest of four each way, where
    # one of each (43 vs 7 ms) failed it in a clean-clone run on a loaded box
    ttft = min(a.token_times()[0] for a in through) - min(a.token_times()[0] for a in direct)
    assert ttft < 0.025, ttft
    assert all(len(a.tokens()) == 10 and a.complete for a in through)


def test_stall_stops_after_n_tokens_for_the_duration_then_goes_on(px):
    a = via(px, "stall", body=prompt(8))
    g = gaps(a)
    print(f"\nstall 600ms after 3 tokens: gap {g[2] * 1e3:.1f} ms, the others at most {max(g[:2] + g[3:]) * 1e3:.1f} ms")
    assert len(a.tokens()) == 8 and a.complete  # nothing lost: it went on where it stopped
    assert 0.59 <= g[2] < 0.75, g  # the gap after the 3rd token (measured at the client: +- its own reads)
    assert max(g[:2] + g[3:]) < 0.1


def test_stall_without_duration_keeps_the_connection_open_until_the_client_gives_up(px):
    before = stats_of(f"127.0.0.1:{px}").faults["hang"].applied
    a = via(px, "hang", body=prompt(8), timeout=1.0)
    assert a.gave_up and not a.closed and not a.complete
    assert len(a.tokens()) == 2 and a.times[-1] < 0.5
    assert stats_of(f"127.0.0.1:{px}").faults["hang"].applied == before + 1


def test_truncate_closes_after_n_tokens_without_the_final_chunk(px):
    a = via(px, "cut", body=prompt(8))
    assert a.status == 200 and len(a.tokens()) == 4 and a.closed and not a.complete
    exact = via(px, "cut", body=prompt(4))  # exactly N tokens: the end itself is cut
    assert len(exact.tokens()) == 4 and exact.closed and not exact.complete


def test_truncate_clean_ends_the_body_properly_after_n_tokens(triton, px):
    direct = call(triton["gateway_port"], STREAM, prompt(8))
    with socket.create_connection(("127.0.0.1", px)) as s:  # kept alive: the next request goes on it
        a = via(px, "clean_cut", body=prompt(8), sock=s)
        after = via(px, None, body=prompt(2), sock=s)
    assert a.status == 200 and a.complete and not a.closed  # the final chunk: a body that ended properly
    assert a.events == direct.events[:4] and len(a.tokens()) == 4  # the first 4 token events, nothing after
    assert after.status == 200 and after.complete and len(after.tokens()) == 2


def test_corrupt_tokens_replaces_token_text_and_keeps_events_valid(triton, px):
    direct = call(triton["gateway_port"], STREAM, prompt(8))
    a = via(px, "garble", body=prompt(8))
    assert a.status == 200 and a.complete and len(a.events) == len(direct.events) == 8
    texts = [json.loads(e[len(b"data: "):])["text_output"] for e in a.events]  # every event is valid JSON
    assert texts == ["#"] * 8 and [json.loads(e[6:])["text_output"] for e in direct.events] != texts
    before = stats_of(f"127.0.0.1:{px}").faults["garble_some"].applied
    some = via(px, "garble_some", body=prompt(12))
    replaced = sum(json.loads(e[6:])["text_output"] == "\ufffd" for e in some.events)
    assert some.complete and len(some.events) == 12 and 1 <= replaced <= 11, replaced  # seed 0: a share of them
    assert stats_of(f"127.0.0.1:{px}").faults["garble_some"].applied == before + 1  # once per stream


@pytest.mark.parametrize("corrupt", ["bad_json", "missing_data", "error_object"])
def test_malformed_corrupts_the_event_after_n_tokens(triton, px, corrupt):
    direct = call(triton["gateway_port"], STREAM, prompt(6))
    a = via(px, corrupt, body=prompt(6))
    assert a.status == 200 and a.complete and a.events[:2] == direct.events[:2]
    bad = a.events[2]
    if corrupt == "bad_json":
        assert bad == direct.events[2].rstrip(b"\n")[:-1] + b"\n\n"  # the closing brace is gone
        assert a.events[3:] == direct.events[3:]
    elif corrupt == "missing_data":
        assert bad == direct.events[2][len(b"data: "):] and not bad.startswith(b"data:")
        assert a.events[3:] == direct.events[3:]
    else:
        assert json.loads(bad[len(b"data: "):])["error"]["type"] == "chaoskit_fault"
        assert len(a.events) == 3  # the stream ends after the error (properly: final chunk)


def test_error_object_of_a_non_streaming_request_is_a_200_with_an_error_body(px):
    a = via(px, "error_object", GENERATE, prompt(4))
    assert a.status == 200 and a.json() == {"error": "llm.proxy fault error_object: injected error"}


def test_rate_limit_per_header_key_answers_429_with_retry_after(px):
    first = [via(px, "rl", GENERATE, prompt(2), headers={"X-Tenant": "a"}).status for _ in range(3)]
    other = via(px, "rl", GENERATE, prompt(2), headers={"X-Tenant": "b"})
    limited = via(px, "rl", GENERATE, prompt(2), headers={"X-Tenant": "a"})
    assert first == [200, 200, 429] and other.status == 200
    assert limited.status == 429 and limited.headers["retry-after"] == "1"


def test_rate_limit_of_tokens_takes_each_streamed_token(px):
    a = via(px, "tl", body=prompt(8))  # admitted with 4 in the bucket; its 8 tokens leave it at -4
    b = via(px, "tl", body=prompt(8))
    assert a.status == 200 and len(a.tokens()) == 8
    assert b.status == 429 and "retry-after" not in b.headers


def test_match_by_model_path_and_header(px):
    assert via(px, "model", body=prompt(2)).status == 500
    assert via(px, "model", GENERATE, prompt(2)).status == 200  # tiny_lm: another model
    assert via(px, None, GENERATE, prompt(2), headers={"X-Canary": "yes-please"}).status == 502
    assert via(px, None, STREAM, prompt(2), headers={"X-Canary": "yes-please"}).status == 200  # not that path
    assert via(px, "storm", "/v2/health/ready", None, method="GET").status == 200  # not a generate path


# ---------------------------------------------------------------- share, seed, counters

def _aborted(port: int, n: int) -> list[int]:
    with socket.create_connection(("127.0.0.1", port)) as s:  # one keep-alive connection, in order
        return [i for i in range(n) if call(port, GENERATE, prompt(1), sock=s).status == 503]


def test_share_is_reproducible_by_seed_and_counted(triton, proxies):
    faults = [{"type": "abort", "status": 503, "share": 0.3, "name": "a"}]
    one, same, other = proxies(triton["url"], [(faults, 11), (faults, 11), (faults, 12)])
    picks = _aborted(one, 60)
    assert _aborted(same, 60) == picks and _aborted(other, 60) != picks
    assert 8 <= len(picks) <= 28
    st = stats_of(f"127.0.0.1:{one}").faults["a"]
    assert (st.matched, st.selected, st.applied) == (60, len(picks), len(picks))
    with urllib.request.urlopen(f"http://127.0.0.1:{one}/chaoskit/metrics", timeout=5) as r:
        text = r.read().decode()
    assert f'llm_proxy_fault_applied_total{{fault="a",type="abort"}} {len(picks)}' in text
    assert "llm_proxy_requests_total 60" in text


def test_load_generator_classifies_what_the_proxy_did(triton, proxies):
    """Open-loop runs through faults with shares (three proxies at once); each error kind the client counts
    equals what the proxy counts for the fault that causes it."""
    ports = proxies(triton["url"], [
        ([{"type": "abort", "status": 429, "share": 0.1, "name": "rl"},
          {"type": "abort", "status": 429, "retry_after": 2, "share": 0.1, "name": "rl-ra"},
          {"type": "abort", "status": 503, "retry_after": 1, "share": 0.1, "name": "unavail"},
          {"type": "truncate", "after_tokens": 3, "share": 0.2, "name": "cut"}], 3),
        ([{"type": "stall", "after_tokens": 2, "share": 0.3, "name": "hang"}], 4),
        ([{"type": "malformed", "corrupt": "missing_data", "after_tokens": 1, "share": 0.3, "name": "bad"}], 5)])
    kinds = {"rl": "rate_limited", "rl-ra": "rate_limited_retry_after", "unavail": "unavailable_retry_after",
             "cut": "stream_truncated", "hang": "stream_stalled", "bad": "stream_malformed"}

    async def runs() -> list[dict]:
        return await asyncio.gather(*(run_load(LoadSpec(
            url=f"http://127.0.0.1:{port}", api="triton", model="tiny_lm_stream", rate=25, duration=2,
            arrival="constant", max_tokens=6, prompt_tokens=8, timeout=3, stall_timeout=0.4)) for port in ports))

    for port, s in zip(ports, asyncio.run(runs()), strict=True):
        applied = {k: v.applied for k, v in stats_of(f"127.0.0.1:{port}").faults.items()}
        print(f"\nclient errors {s['errors']}, proxy applied {applied}")
        assert s["sender"] == "python" and s["sent"] == 50
        assert s["errors"] == {kinds[k]: n for k, n in applied.items() if n}
        assert s["ok"] == 50 - sum(applied.values()) and s["ok"] > 0 and all(applied.values())


# ---------------------------------------------------------------- the correctness probe (its OpenAI side:
# tests/integration/test_correctness_probe.py)

PROMPTS = ["The capital of France is", "chaos engineering", "hello", "a b c d", "inference under faults"]


def answers(url: str, samples: int = 2, **kw) -> list[dict]:
    """Samples of a correctness probe on tiny_lm_stream (50 requests of 16 tokens): the first records the answers
    (from record_url when given), the others are judged against them."""
    p = CorrectnessProbe(CorrectnessProbeSpec(type="correctness", name="answers", url=url, api="triton",
                                              model="tiny_lm_stream", prompts=PROMPTS, requests=50, max_tokens=16,
                                              **kw))

    async def run() -> list[dict]:
        try:
            return [await p.measure() for _ in range(samples)]
        finally:
            await p.close()

    return asyncio.run(run())


def test_correctness_probe_catches_corrupt_tokens_at_1_percent_within_one_sample_of_50(triton, proxies):
    (port,) = proxies(triton["url"], [([{"type": "corrupt_tokens", "name": "garble", "token_share": "1%"}], 1)])
    recorded, judged = answers(f"http://127.0.0.1:{port}", record_url=triton["url"])
    garbled = stats_of(f"127.0.0.1:{port}").faults["garble"].applied
    print(f"\ncorrupt_tokens 1% of 50 x 16 tokens: {garbled} streams garbled; the probe: {judged['first_failure']}")
    assert recorded["failed"] == 0 and recorded["recorded"] == len(PROMPTS)
    assert judged["failed"] == judged["failures.mismatch"] == garbled >= 1  # each garbled stream, nothing else


def test_correctness_probe_passes_a_healthy_deployment_3_runs_of_3(triton):
    runs = [answers(triton["url"]) for _ in range(3)]
    print(f"\nhealthy: failed {[s['failed'] for r in runs for s in r]} of 50 each")
    assert all(s["failed"] == 0 and s["recorded"] == len(PROMPTS) for r in runs for s in r)


def test_revert_stops_the_proxy_from_its_record_alone(triton):
    port, rec = _start(triton["url"], [{"type": "truncate", "after_tokens": 1}])
    rec = LlmProxy.from_ledger(json.loads(json.dumps(LlmProxy.to_ledger(rec))))  # as the ledger holds it
    details = LlmProxy.observe_details(rec)
    assert details["in_effect"] and details["faults"]["truncate-0"]["matched"] == 0
    LlmProxy.revert(rec)
    LlmProxy.revert(rec)  # twice is fine
    assert not LlmProxy.observe(rec) and not [p for p in all_pids() if rec.token in cmdline(p)]
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", port), timeout=1).close()


CUT_BODY = b"".join(b"%x\r\n%b\r\n" % (len(e), e) for e in (b"data: 1\n\n", b"x" * 5000, b"0\r\n\r\n")) + b"0\r\n\r\n"


def _raw_upstream(srv: socket.socket) -> None:
    """Two requests on one connection: a chunked answer written in pieces cut inside size lines and data, then
    one whose framing breaks (a size line that is not hex) after its first chunk, written at once."""
    conn, _ = srv.accept()
    head = b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nTransfer-Encoding: chunked\r\n\r\n"
    with conn:
        try:
            conn.recv(65536)
            answer = head + CUT_BODY
            for i in range(0, len(answer), 7):
                conn.sendall(answer[i:i + 7])
            conn.recv(65536)
            conn.sendall(head + b"3\r\nabc\r\nzz\r\n")
            conn.recv(65536)
        except OSError:  # the proxy closed its side after the broken framing
            pass


def test_a_relayed_chunked_body_ends_where_it_ends_and_broken_framing_cuts_the_connection():
    """A response no fault touches goes on as it came; its end, found across arbitrary cuts, frees the client's
    kept-alive connection for the next request; where the upstream's framing breaks, the client gets what came
    and the connection closes (its answer cannot be delimited)."""
    with socket.create_server(("127.0.0.1", 0)) as srv:
        up = threading.Thread(target=_raw_upstream, args=(srv,), daemon=True)
        up.start()
        port, rec = _start(f"127.0.0.1:{srv.getsockname()[1]}", [])
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=10) as c:
                first = call(port, "/plain", {}, sock=c)
                assert first.status == 200 and first.complete and not first.closed
                assert first.body == b"data: 1\n\n" + b"x" * 5000 + b"0\r\n\r\n"
                c.sendall(request_bytes("/broken", {}, None, "POST"))
                got = b""
                while data := c.recv(65536):  # until the proxy closes (a timeout fails the test)
                    got += data
                assert got.startswith(b"HTTP/1.1 200") and b"\r\n\r\n3\r\nabc\r\nzz" in got, got
        finally:
            _stop(rec)
        up.join(10)


# ---------------------------------------------------------------- vLLM (OpenAI API), when installed

@pytest.fixture
def vllm_ref(vllm_pair):
    return vllm_facts(vllm_pair)


def completion(n: int, stream: bool = True) -> dict:
    """Greedy, so direct and proxied answers are the same tokens (this prompt: 7 token events of 8, the
    random-weight model emits one token that decodes to no text)."""
    return {"model": vllm.SERVED_NAME, "prompt": "hello world", "max_tokens": n, "stream": stream,
            "ignore_eos": True, "temperature": 0}


def test_vllm_openai_streams_under_each_fault(vllm_ref, proxies):
    """On the real OpenAI-compatible server: the cut drops [DONE]; the stall's gap; the malformed event; the
    429 with Retry-After; the non-streaming error object; the token gap."""
    (port,) = proxies(vllm_ref["url"], [(by_header({
        "cut": {"type": "truncate", "after_tokens": 3},
        "stall": {"type": "stall", "after_tokens": 2, "duration": "500ms"},
        "bad": {"type": "malformed", "corrupt": "bad_json", "after_tokens": 1,
                "match": {"path": "/v1/completions", "model": "tiny-*"}},
        "limited": {"type": "abort", "status": 429, "retry_after": 3},
        "err": {"type": "malformed", "corrupt": "error_object"},
        "slow": {"type": "token_delay", "delay": "40ms"}}), 0)])

    def v(fault: str, body: dict, path: str = "/v1/completions", tokens: int = 0, first_within: float = 30) -> Answer:
        """The answer through the proxy (fault "": straight from the deployment's gateway); one that came whole
        with fewer than `tokens` token events could not show the fault and is asked again (5 tries): vLLM merges
        the deltas its busy API server has not sent yet into one event (vllm/v1/engine/output_processor.py,
        RequestOutputCollector.put), so 8 tokens came as 2 events in a CI run, and the cut after 3 had nothing to
        cut (and as 3 events in another, asked directly). One whose first token was read more than `first_within`
        seconds after the send is asked again too (see token_delay below)."""
        for attempt in range(5):
            answer = call(port, path, body, headers={"X-Fault": fault}, timeout=30) if fault else \
                call(vllm_ref["gateway_port"], path, body, timeout=30)
            late = answer.complete and bool(answer.tokens()) and answer.token_times()[0] > first_within
            if not (answer.complete and len(answer.tokens()) < tokens or late):
                break
            print(f"\n{fault or 'direct'}: vLLM sent {len(answer.tokens())} token events, the first read after "
                  f"{answer.token_times()[0] if answer.tokens() else None} s (try {attempt + 1}): asked again")
        return answer

    direct = v("", completion(8), tokens=4)
    done = b"data: [DONE]\n\n"
    assert direct.complete and direct.events[-1] == done and len(direct.tokens()) >= 4
    # (vLLM's incremental detokenizer groups held-back text differently from run to run: compare the effects)
    a = v("cut", completion(8), tokens=4)
    assert len(a.tokens()) == 3 and a.closed and not a.complete and done not in a.events
    assert a.events[-1] == a.tokens()[-1]  # nothing after the 3rd token
    b = v("stall", completion(8), tokens=2)
    assert len(b.token_positions()) >= 2, (b.status, b.events)  # (failed once in a CI run: say what came back)
    second = b.token_positions()[1]
    stalled_at, after = b.times[second], b.times[second + 1]  # the 2nd token, then the pause
    # the pause is >= 500 ms at the proxy; here it is measured at the client, whose own reads (and the proxy's wake-up
    # on a box where vLLM's worker polls a core) can move either end by some ms, and the token after it is vLLM's
    # next one (0.94 s once in a full CI run on 2 busy cores): the upper bound tells a 500 ms stall from one that
    # lasts until the client gives up (30 s), not from a slow next token
    # the lower bound from the send (times are seconds after it): the token after a 500 ms pause cannot come
    # sooner, however late the client read the 2nd one (a gap of 0.444 s once: its read 56 ms late)
    assert after >= 0.5 and after - stalled_at < 2.0, (stalled_at, after)
    assert b.complete and b.events[-1] == done
    c = v("bad", completion(8), tokens=2)
    bad = c.tokens()[1]  # the token event after the first: its JSON lost the closing brace
    assert not bad.rstrip().endswith(b"}") and bad.startswith(b"data: {")
    with pytest.raises(ValueError):
        json.loads(bad[6:])
    assert c.events[-1] == done and c.complete
    d = v("limited", {"model": vllm.SERVED_NAME, "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]},
          "/v1/chat/completions")
    assert d.status == 429 and d.headers["retry-after"] == "3" and d.json()["error"]["code"] == 429
    e = v("err", completion(2, stream=False))
    assert e.status == 200 and e.json()["error"]["type"] == "chaoskit_fault"
    # a first token read late means the client or the proxy was held up (a busy box): the tokens due meanwhile
    # come at once after it and the span shrinks by the hold-up (measured beside four busy loops: 3 of 25 streams
    # read their first token 404-440 ms after the send, one with 8 gaps of 0 ms and 227 ms in all where 453 ms is
    # the bound below; the rest within 165 ms); the first token is never delayed, so asking again when it came
    # late cannot hide a wrong delay
    f = v("slow", completion(16), tokens=11, first_within=0.2)
    g = gaps(f)  # each = the upstream's own gap (vLLM sends this one in bursts) + the 40 ms added
    print(f"\nvLLM: stall gap {(after - stalled_at) * 1e3:.1f} ms; token_delay 40ms: gaps {min(g) * 1e3:.1f}.."
          f"{max(g) * 1e3:.1f} ms, mean {statistics.mean(g) * 1e3:.1f} (direct p50 "
          f"{statistics.median(gaps(direct)) * 1e3:.1f} ms)")
    # the first token is never held, so the last one left the proxy at least (n - 1) x 40 ms after it; the client's
    # span is shorter by as much as it read the first one late (a late read lengthens one gap and shortens the
    # next): 100 ms allowed for that (in a clean-clone run of 057975d the gaps were 0, 18, 46, 44, 37, 42 ms: the
    # first two tokens read together, 52 ms short of 6 x 40); 16 tokens asked, so that a delay on every other
    # token, or none, still falls short of the bound
    assert f.complete and f.events[-1] == done and len(g) >= 10
    assert sum(g) >= len(g) * 0.0395 - 0.1, g
    # below 250 ms: a delay applied twice, or per byte, would show; a finer upper bound measured this 2-core box
    # (vLLM's worker polls a core; once the gaps were 117-230 ms with the direct stream's 4.6 ms), not the proxy
    assert statistics.median(g) < 0.25
