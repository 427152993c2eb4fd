#!/usr/bin/env bash
# `make test`: the unit tests (pure: no process, namespace or port outside pytest's own temporary directory) run
# beside the rest of the suite, which mostly waits on scenario durations (a whole run uses under half of 2 cores):
# about half a minute off the wall time. The rest runs as before, in order; both outputs are shown, unit last.
# Extra pytest arguments: PYTEST_ARGS (given to both; "no tests collected" is then not a failure).
set -uo pipefail
cd "$(dirname "$0")/.."
PY=.venv/bin/python
read -r -a extra <<< "${PYTEST_ARGS:-}"
unit=""
tmp=$(mktemp -d /tmp/chaoskit-unit-XXXXXX)
trap 'kill "$unit" 2>/dev/null; rm -rf "$tmp"' EXIT
"$PY" -m pytest -q -p no:cacheprovider --basetemp "$tmp/base" tests/unit "${extra[@]}" > "$tmp/unit.log" 2>&1 &
unit=$!
"$PY" -m pytest -q --durations=25 --ignore=tests/unit "${extra[@]}"
rest=$?
wait "$unit"
u=$?
echo "--- tests/unit (run beside the rest above)"
tail -n 40 "$tmp/unit.log"
ok() { [ "$1" -eq 0 ] || { [ "$1" -eq 5 ] && [ ${#extra[@]} -gt 0 ]; }; }
ok "$rest" && ok "$u"
