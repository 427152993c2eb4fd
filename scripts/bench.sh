#!/usr/bin/env bash
# `make bench`: every benchmark in turn, each to its end even when one before it missed a goal or failed, then a
# summary (one line per bench: its goal_met and missed= from its RESULT line, or how it failed). Exit 1 when any
# bench missed a goal, exited non-zero or printed no goal_met=True|False (a bench that judges nothing is not green),
# else 0.
# Arguments: bench command lines to run instead of the full list (each one word-split, run with the venv's python),
# e.g. scripts/bench.sh "bench/soak.py --runs 20" "bench/kube_scale.py --goal rollback_s=0".
# Each bench states its goals at its top (bench/goals.py); BENCH_GOALS="key=value ..." in the environment or
# `--goal key=value` on a command line sets a goal's limit for a run.
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
if [ $# -gt 0 ]; then
    benches=("$@")
else
    benches=(
        bench/rollback_bench.py
        bench/proxy_bench.py
        bench/netem_bench.py
        bench/reference_bench.py
        bench/load_bench.py
        bench/ebpf_overhead.py
        bench/memory_bench.py
        bench/llm_proxy_bench.py
        bench/scale_bench.py
        bench/kube_scale.py
        bench/gateway_matrix.py
        "bench/torture.py --runs 50"
        bench/fuzz.py
        bench/soak.py
    )
fi
out=$(mktemp -d /tmp/chaoskit-bench-XXXXXX)
trap 'rm -rf "$out"' EXIT
summary=()
failed=0
for i in "${!benches[@]}"; do
    read -r -a cmd <<< "${benches[$i]}"
    echo "== ${benches[$i]}"
    "$PY" "${cmd[@]}" 2>&1 | tee "$out/$i.log"
    rc=${PIPESTATUS[0]}
    result=$(grep '^RESULT ' "$out/$i.log" | tail -n 1)
    goal=$(grep -o 'goal_met=[A-Za-z]*' <<< "$result" | tail -n 1)
    missed=$(grep -o ' missed=[^ ]*' <<< "$result" | tail -n 1)
    if [ "$rc" -eq 0 ] && [ "$goal" = "goal_met=True" ]; then
        summary+=("ok      ${benches[$i]}: $goal")
    elif [ -n "$goal" ]; then
        summary+=("MISSED  ${benches[$i]}: exit $rc, $goal$missed")
        failed=1
    else
        summary+=("FAILED  ${benches[$i]}: exit $rc, no RESULT line with goal_met")  # unjudged is not green
        failed=1
    fi
done
echo
echo "== bench summary (${#benches[@]} benches)"
printf '%s\n' "${summary[@]}"
exit $failed
