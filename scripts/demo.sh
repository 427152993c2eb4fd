#!/usr/bin/env bash
# make demo: start the bundled reference deployment (2 real Triton replicas + gateway), run a bundled
# experiment against it, print the verdict and report path, then stop the deployment.
set -uo pipefail
cd "$(dirname "$0")/.."
export CHAOSKIT_REF_DIR=${CHAOSKIT_REF_DIR:-.chaoskit/demo-ref}
PORT=${DEMO_PORT:-8400}
CK=.venv/bin/chaoskit
trap '$CK ref down' EXIT
$CK ref up --port "$PORT" || exit $?
$CK run experiments/reference/stall-one-replica.yaml --out chaoskit-runs/demo \
  --junit chaoskit-runs/demo/junit.xml
code=$?
echo "demo: chaoskit exited $code (0 held; 1 deviated: requests reached the frozen replica before the gateway ejected it)"
echo "demo: report chaoskit-runs/demo/report.html, journal chaoskit-runs/demo/journal.jsonl"
[ "$code" -le 1 ]
