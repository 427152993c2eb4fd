#!/usr/bin/env bash
# make demo: start a real local service, run a bundled experiment against it, print the verdict, clean up.
# (Uses a local HTTP server until the bundled Triton/vLLM reference deployment lands: `chaoskit ref up`.)
set -uo pipefail
cd "$(dirname "$0")/.."
PORT=${DEMO_PORT:-8765}
SERVE_DIR=$(mktemp -d)
echo "chaoskit demo" > "$SERVE_DIR/index.html"
.venv/bin/python -m http.server "$PORT" --bind 127.0.0.1 --directory "$SERVE_DIR" >/dev/null 2>&1 &
SERVER=$!
cleanup() { kill -CONT "$SERVER" 2>/dev/null; kill "$SERVER" 2>/dev/null; wait "$SERVER" 2>/dev/null; rm -rf "$SERVE_DIR"; }
trap cleanup EXIT
for _ in $(seq 50); do
  .venv/bin/python -c "import socket; socket.create_connection(('127.0.0.1', $PORT), 0.2)" 2>/dev/null && break
  sleep 0.1
done
echo "demo service: http://127.0.0.1:$PORT/ (PID $SERVER)"
.venv/bin/chaoskit run experiments/basic/stop-http-server.yaml --var port="$PORT" \
  --out chaoskit-runs/demo --junit chaoskit-runs/demo/junit.xml
code=$?
echo "demo: chaoskit exited $code (0 held, 1 deviated: the probe saw the frozen server, as expected)"
echo "demo: report chaoskit-runs/demo/report.html"
[ "$code" -le 1 ]
