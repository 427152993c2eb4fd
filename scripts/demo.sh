#!/usr/bin/env bash
# make demo: one command replays the SITS2026 health-check blind spot. `chaoskit run` brings up its own
# reference deployment (2 real Triton replicas + gateway), CPU-throttles replica 0's model process, and
# takes the deployment down again: once as shipped (status-only health checks: the replica's health probe
# passes while the latency SLA deviates), once with the fix (latency-aware health checks eject it).
set -uo pipefail
cd "$(dirname "$0")/.."
export CHAOSKIT_REF_DIR=${CHAOSKIT_REF_DIR:-.chaoskit/demo-ref}
CK=.venv/bin/chaoskit
SCENARIO=sits2026/health-check-blindspot  # bundled: experiments/sits2026/
$CK run "$SCENARIO" --out chaoskit-runs/demo --junit chaoskit-runs/demo/junit.xml
code=$?
echo "demo: without the fix chaoskit exited $code (expected 1, deviated: replica-0-ready passed while the" \
     "SLA broke - the blind spot)"
$CK run "$SCENARIO" --var fix=true --out chaoskit-runs/demo-fix --junit chaoskit-runs/demo-fix/junit.xml
fixed=$?
echo "demo: with --var fix=true chaoskit exited $fixed (expected 0, held: latency health ejected replica 0)"
echo "demo: reports chaoskit-runs/demo/report.html and chaoskit-runs/demo-fix/report.html"
[ "$code" -eq 1 ] && [ "$fixed" -eq 0 ]
