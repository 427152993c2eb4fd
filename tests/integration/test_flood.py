"""load.flood for real: its helper (started without site, as every helper is) sends requests to a local server;
a fresh process given only the record stops it; a second revert is a no-op."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from chaoskit.injectors.base import FaultContext
from chaoskit.injectors.flood.fault import Flood
from tests.conftest import ROOT, wait_for

REVERT = "import json, sys; from chaoskit.injectors import injector_class; cls = injector_class('load.flood'); " \
         "cls.revert(cls.from_ledger(json.loads(sys.argv[1])))"


class _Count(BaseHTTPRequestHandler):
    hits = 0

    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        type(self).hits += 1
        self.send_response(200)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"ok")

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def server() -> Iterator[tuple[int, type[_Count]]]:
    handler = type("Count", (_Count,), {"hits": 0})
    srv = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    srv.daemon_threads = True
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        yield srv.server_address[1], handler
    finally:
        srv.shutdown()
        srv.server_close()


def test_the_flood_sends_and_a_fresh_process_stops_it_from_the_record(server):
    port, handler = server
    spec = Flood.Spec.model_validate({"type": "load.flood", "load": {
        "url": f"http://127.0.0.1:{port}/", "api": "http", "rate": 50, "arrival": "constant"}})
    inj = Flood(spec, FaultContext(lifetime_s=60))
    record = inj.apply(inj.prepare())
    try:
        wait_for(lambda: handler.hits >= 10, timeout=20)
        assert Flood.observe(record)
    finally:
        subprocess.run([sys.executable, "-c", REVERT, json.dumps(record.to_json())], cwd=ROOT, check=True, timeout=60)
    assert not Flood.observe(record)
    stopped_at = handler.hits
    Flood.revert(record)  # idempotent
    time.sleep(0.5)  # 25 requests at 50/s, had it gone on
    # in flight at the stop at most: a few when the server, slow on a loaded host, counts them once handled (a
    # clean-clone run counted 2); far from the 25 a flood still going would have sent
    assert handler.hits <= stopped_at + 5
