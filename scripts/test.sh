#!/usr/bin/env bash
# `make test`. A whole run in one process uses under half of 2 cores (it mostly waits on scenario durations), so
# the suite runs as three pytest processes side by side, then one alone:
#   unit         tests/unit (pure: no process, namespace or port outside pytest's own temporary directory);
#   scenarios    tests/e2e, tests/vllm, tests/integration/test_llm_proxy.py (every test on the shared vLLM pair
#                in one process: it starts once) and test_reference.py (the two streams about even); its
#                reference deployments search for free ports from 28000 (CHAOSKIT_REF_FIRST_PORT), the other
#                stream's from 18000, so the two never race for a block;
#   integration  the rest of tests/integration, in the foreground;
#   reliability  tests/reliability last and alone: the torture test compares the whole host before and after.
# Every output is shown, the background ones after the foreground's. Extra pytest arguments: PYTEST_ARGS (given
# to each; "no tests collected" is then not a failure).
set -uo pipefail
cd "$(dirname "$0")/.."
PY=.venv/bin/python
read -r -a extra <<< "${PYTEST_ARGS:-}"
tmp=$(mktemp -d /tmp/chaoskit-test-XXXXXX)
pids=()
trap 'kill "${pids[@]}" 2>/dev/null; rm -rf "$tmp"' EXIT

background() {  # NAME ENV... -- PYTEST ARGS...: run pytest in the background, output to $tmp/NAME.log
    local name=$1 envs=()
    shift
    while [ "$1" != "--" ]; do envs+=("$1"); shift; done
    shift
    env "${envs[@]}" "$PY" -m pytest -q -p no:cacheprovider --basetemp "$tmp/$name" "$@" "${extra[@]}" \
        > "$tmp/$name.log" 2>&1 &
    pids+=($!)
}

start=$SECONDS
background unit -- tests/unit
background scenarios CHAOSKIT_REF_FIRST_PORT=28000 -- --durations=15 tests/e2e tests/vllm \
    tests/integration/test_llm_proxy.py tests/integration/test_reference.py
"$PY" -m pytest -q -p no:cacheprovider --durations=15 tests/integration \
    --ignore=tests/integration/test_llm_proxy.py --ignore=tests/integration/test_reference.py "${extra[@]}"
integration=$?
wait "${pids[0]}"; unit=$?
wait "${pids[1]}"; scenarios=$?
for name in scenarios unit; do
    echo "--- $name (ran beside the integration tests above)"
    cat "$tmp/$name.log"
done
echo "--- reliability (alone; after $((SECONDS - start)) s)"
"$PY" -m pytest -q -p no:cacheprovider tests/reliability "${extra[@]}"
reliability=$?
echo "--- make test: $((SECONDS - start)) s of tests; exit: integration $integration, scenarios $scenarios," \
     "unit $unit, reliability $reliability"
ok() { [ "$1" -eq 0 ] || { [ "$1" -eq 5 ] && [ ${#extra[@]} -gt 0 ]; }; }
ok "$integration" && ok "$scenarios" && ok "$unit" && ok "$reliability"
