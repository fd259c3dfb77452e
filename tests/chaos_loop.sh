#!/usr/bin/env bash
# Run one fault scenario of tests/test_pg_chaos.py N times in a row and
# count the passes and failures.
#
#   tests/chaos_loop.sh SCENARIO [N]        (N defaults to 20)
#
# SCENARIO: fast | immediate | terminate-0.5 | terminate-0.1 | sigcont |
# sigkill | all, or any pytest node id or -k expression of the module.
# Each run's whole output goes to $LOGS/run-<i>.log (LOGS default: a new
# directory under /tmp), the children's logs to $LOGS/run-<i>/, and its
# one-line summary and problems ("chaos: ...") are printed as it ends. The exit status is 0 when every run passed.
#
# PYTHON (default: the project's .venv/bin/python) runs pytest.

set -u

here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
scenario="${1:?usage: tests/chaos_loop.sh SCENARIO [N]}"
runs="${2:-20}"
python="${PYTHON:-$here/.venv/bin/python}"
logs="${LOGS:-$(mktemp -d /tmp/chaos-loop-XXXXXX)}"
mkdir -p "$logs"

module="tests/test_pg_chaos.py"
case "$scenario" in
    fast) select=("$module::test_a_server_restart_under_load[fast]") ;;
    immediate) select=("$module::test_a_server_restart_under_load[immediate]") ;;
    terminate-0.5) select=("$module::test_sessions_terminated_under_load[every-0.5s-for-5s]") ;;
    terminate-0.1) select=("$module::test_sessions_terminated_under_load[every-0.1s-for-10s]") ;;
    sigcont) select=("$module::test_a_runner_stopped_inside_a_write[SIGCONT]") ;;
    sigkill) select=("$module::test_a_runner_stopped_inside_a_write[SIGKILL]") ;;
    all) select=("$module") ;;
    *::*|*.py) select=("$scenario") ;;
    *) select=("$module" -k "$scenario") ;;
esac

passed=0
failed=0
echo "scenario $scenario, $runs run(s); logs in $logs"
for ((i = 1; i <= runs; i++)); do
    log="$logs/run-$i.log"
    start=$SECONDS
    (cd "$here" && CHAOS_LOGS="$logs/run-$i" "$python" -m pytest -q -s -n 0 "${select[@]}") >"$log" 2>&1
    status=$?
    took=$((SECONDS - start))
    if [ "$status" -eq 0 ]; then
        passed=$((passed + 1))
        verdict=PASS
    else
        failed=$((failed + 1))
        verdict=FAIL
    fi
    printf 'run %d: %s (%d s, pytest exit %d)\n' "$i" "$verdict" "$took" "$status"
    grep -E '^chaos: ' "$log" | cut -c1-400 | sed 's/^/    /'
    if [ "$status" -ne 0 ] && ! grep -qE '^chaos: ' "$log"; then
        # Failed before its summary (a timeout, an error in the test itself).
        grep -E '^(E |FAILED|ERROR)' "$log" | head -5 | cut -c1-300 | sed 's/^/    /'
    fi
done
echo "scenario $scenario: $passed passed, $failed failed of $runs; logs in $logs"
[ "$failed" -eq 0 ]
