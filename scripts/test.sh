#!/usr/bin/env bash
# `make test`. A whole run in one process uses under half of 2 cores (it mostly waits on scenario durations), so
# the suite runs as three pytest processes side by side, then one alone:
#   unit         tests/unit (no namespace, port or other host state outside pytest's own temporary directory);
#   scenarios    tests/e2e, tests/vllm and tests/integration/test_llm_proxy.py (every test on the shared vLLM
#                pair in one process: it starts once); its reference deployments search for free ports from
#                28000 (CHAOSKIT_REF_FIRST_PORT), the other stream's from 18000, so the two never race for a block;
#   integration  the rest of tests/integration, in the foreground;
#   alone        tests/reliability (the torture test compares the whole host before and after),
#                test_memory_pressure.py (it holds the host's used memory within 2% of a target) and the tests
#                that hold timings to a few ms (the load generator's, the proxies' latency, the SLO windows', the
#                gateway's token-by-token streaming).
# Every output is shown, the background ones after the foreground's. Ctrl-C stops every stream (each tears its
# fixtures down) and skips the last one. Extra pytest arguments: PYTEST_ARGS (given to each; "no tests
# collected" is then not a failure).
set -uo pipefail
cd "$(dirname "$0")/.."
PY=.venv/bin/python
read -r -a extra <<< "${PYTEST_ARGS:-}"
tmp=$(mktemp -d /tmp/chaoskit-test-XXXXXX)
pids=()
stopped=0

stop_background() {  # SIGINT (pytest tears its fixtures down), SIGKILL what is left after 60 s
    local pid alive
    for pid in ${pids[@]+"${pids[@]}"}; do kill -INT "$pid" 2>/dev/null; done
    for _ in $(seq 600); do
        alive=0
        for pid in ${pids[@]+"${pids[@]}"}; do kill -0 "$pid" 2>/dev/null && alive=1; done
        [ "$alive" -eq 0 ] && return
        sleep 0.1
    done
    for pid in ${pids[@]+"${pids[@]}"}; do kill -KILL "$pid" 2>/dev/null; done
}
trap 'stopped=1' INT TERM
trap 'stop_background; rm -rf "$tmp"' EXIT

background() {  # NAME ENV... -- PYTEST ARGS...: pytest in the background, its output in $tmp/NAME.log
    local name=$1 envs=()
    shift
    while [ "$1" != "--" ]; do envs+=("$1"); shift; done
    shift
    # a background job of a script starts with SIGINT ignored: give it back, so Ctrl-C reaches it too
    env --default-signal=INT ${envs[@]+"${envs[@]}"} "$PY" -m pytest -q -p no:cacheprovider \
        --basetemp "$tmp/$name" "$@" ${extra[@]+"${extra[@]}"} > "$tmp/$name.log" 2>&1 &
    pids+=($!)
}

alone=(tests/reliability tests/integration/test_memory_pressure.py tests/integration/test_load.py
       tests/integration/test_load_senders.py tests/integration/test_slo_over_phase.py tests/integration/test_proxy.py
       tests/integration/test_reference.py tests/integration/test_slo_prom_probes.py)
start=$SECONDS
background unit -- tests/unit
background scenarios CHAOSKIT_REF_FIRST_PORT=28000 -- --durations=15 tests/e2e tests/vllm \
    tests/integration/test_llm_proxy.py
"$PY" -m pytest -q -p no:cacheprovider --durations=15 tests/integration \
    --ignore=tests/integration/test_llm_proxy.py $(printf -- '--ignore=%s ' "${alone[@]:1}") \
    ${extra[@]+"${extra[@]}"}
integration=$?
[ "$stopped" -eq 1 ] && stop_background
wait "${pids[0]}"; unit=$?
wait "${pids[1]}"; scenarios=$?
for name in scenarios unit; do
    echo "--- $name (ran beside the integration tests above)"
    cat "$tmp/$name.log"
done
if [ "$stopped" -eq 1 ]; then
    echo "--- stopped (Ctrl-C or SIGTERM) after $((SECONDS - start)) s"
    exit 130
fi
echo "--- alone (after $((SECONDS - start)) s)"
"$PY" -m pytest -q -p no:cacheprovider "${alone[@]}" ${extra[@]+"${extra[@]}"}
lone=$?
echo "--- make test: $((SECONDS - start)) s of tests; exit: integration $integration, scenarios $scenarios," \
     "unit $unit, alone $lone"
ok() { [ "$1" -eq 0 ] || { [ "$1" -eq 5 ] && [ ${#extra[@]} -gt 0 ]; }; }
ok "$integration" && ok "$scenarios" && ok "$unit" && ok "$lone"
