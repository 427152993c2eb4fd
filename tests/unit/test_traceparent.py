"""Trace-context propagation, without a run: the traceparent read and written, the environment carrier, the load
generator's request bytes, network.proxy's look at a connection's first bytes, llm.proxy's per-request count."""

from __future__ import annotations

import pytest

from chaoskit.injectors.llm_proxy.faults import FaultTable
from chaoskit.injectors.llm_proxy.trace import Counted, RequestTrace
from chaoskit.injectors.proxy.trace import http_traceparent, incoming
from chaoskit.load.fastclient import request_bytes
from chaoskit.load.traceparent import format_header, from_env, parse
from chaoskit.observe.traces import EnvCarrier

TID, SID = 0x4BF92F3577B34DA6A3CE929D0E0E4736, 0x00F067AA0BA902B7
VALUE = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


def test_a_traceparent_reads_back_and_bad_ones_are_none():
    assert parse(VALUE) == (TID, SID, 1) and format_header(TID, SID) == VALUE
    assert format_header(TID, SID, sampled=False) == VALUE[:-2] + "00"
    assert parse("01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-later") == (TID, SID, 1)  # a newer version
    for bad in (None, "", "garbage", VALUE.upper(), VALUE + "-x", "ff" + VALUE[2:],
                "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
                "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01"):
        assert parse(bad) is None, bad


def test_the_load_sends_the_environments_trace_sampled_or_nothing():
    assert from_env({"TRACEPARENT": VALUE[:-2] + "00"}) == VALUE
    assert from_env({}) is None and from_env({"TRACEPARENT": "nonsense"}) is None


def test_request_bytes_carry_the_header_only_when_given():
    plain = request_bytes("POST", "http://h:8000/v1/completions", {"a": 1})
    traced = request_bytes("POST", "http://h:8000/v1/completions", {"a": 1}, {"traceparent": VALUE})
    assert b"traceparent" not in plain
    assert traced == plain.replace(b"Accept: */*\r\n", f"Accept: */*\r\ntraceparent: {VALUE}\r\n".encode())


def test_the_env_carrier_puts_back_what_was_there():
    env = {"TRACEPARENT": "theirs"}
    c = EnvCarrier(env)
    c.set({"TRACEPARENT": VALUE, "CHAOSKIT_OTLP_ENDPOINT": "http://x/v1/traces"})
    assert env == {"TRACEPARENT": VALUE, "CHAOSKIT_OTLP_ENDPOINT": "http://x/v1/traces"}
    c.restore()
    c.restore()
    assert env == {"TRACEPARENT": "theirs"}


@pytest.mark.parametrize(("first", "found"), [
    (f"POST /v1/completions HTTP/1.1\r\nHost: h\r\ntraceparent: {VALUE}\r\n\r\n{{}}".encode(), (TID, SID)),
    (f"GET / HTTP/1.1\r\nTraceParent:{VALUE}\r\n\r\n".encode(), (TID, SID)),
    (f"GET / HTTP/1.1\r\ntraceparent: {VALUE[:-2]}00\r\n\r\n".encode(), None),  # not sampled: no span
    (f"GET / HTTP/1.1\r\nHost: h\r\n\r\ntraceparent: {VALUE}\r\n".encode(), None),  # in the body, not the head
    (b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03", None),  # a TLS ClientHello
    (f"SSH-2.0-OpenSSH_9.2\r\ntraceparent: {VALUE}\r\n".encode(), None),
])
def test_network_proxy_reads_a_trace_only_from_an_http_request_head(first, found):
    assert http_traceparent(first) == found
    assert incoming(VALUE) == (TID, SID)


def test_a_counted_fault_counts_one_requests_effects_and_the_shared_total():
    (f,) = FaultTable([{"name": "cut", "type": "truncate", "params": {"after_tokens": 2}}], 0).faults
    f.applied = 5
    c = Counted(f)
    c.applied += 1
    assert (c.hits, f.applied, c.params.after_tokens, c.name) == (1, 6, 2, "cut")


def test_a_traced_request_goes_upstream_with_the_proxys_span_as_its_parent():
    t = RequestTrace(TID, SID, 0xABC, 0, {})
    raw = f"POST /v1/completions HTTP/1.1\r\nTraceparent:  {VALUE}\r\nContent-Length: 2\r\n\r\n{{}}".encode()
    out = t.propagate(raw)
    assert out == raw.replace(f"  {VALUE}".encode(), f" 00-{TID:032x}-{0xABC:016x}-01".encode())
    assert parse(out.split(b"\r\n")[1].split(b":", 1)[1].decode()) == (TID, 0xABC, 1)
