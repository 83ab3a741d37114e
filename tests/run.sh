#!/bin/sh
# Runs every test and prints the sum as the last line: "N passed, N failed".
#   unit tests:        build/tests/*           (C, tests/unit/*.c)
#   integration tests: tests/integration/*.sh and *.py, against the built binary
#   --device:          build/tests/device/*    (GPU host only)
# Each test prints PASS:/FAIL: lines; a test that crashes or exits non-zero without a FAIL
# line counts as one failure; after its output, "-- name: N s" says how long it took. Set
# TESTS=pattern to run a subset.
BUILD=${BUILD:-build}
export SEMFLOW_BIN="$PWD/$BUILD/semflow" SF_BUILD="$PWD/$BUILD"
export SEMFLOW_DEMO_DIR="${SEMFLOW_DEMO_DIR:-$PWD/$BUILD/demo-model}"
passed=0; failed=0
log=$(mktemp)
run_one() {
    name=$1; shift
    case "$name" in *${TESTS:-}*) ;; *) return ;; esac
    echo "== $name"
    t0=$(date +%s)
    timeout "${TEST_TIMEOUT:-900}" "$@" >"$log" 2>&1
    rc=$?
    cat "$log"
    echo "-- $name: $(($(date +%s) - t0)) s"
    p=$(grep -c '^PASS: ' "$log"); f=$(grep -c '^FAIL: ' "$log")
    if [ "$rc" != 0 ] && [ "$f" = 0 ]; then
        echo "FAIL: $name: exited with status $rc"; f=1
    fi
    passed=$((passed + p)); failed=$((failed + f))
}
if [ "$1" = "--device" ]; then
    for t in "$BUILD"/tests/device/*; do [ -x "$t" ] && run_one "$(basename "$t")" "$t"; done
    for t in tests/device/*.sh tests/device/*.py; do
        [ -f "$t" ] || continue
        case "$t" in *.py) run_one "$t" python3 "$t" ;; *) run_one "$t" sh "$t" ;; esac
    done
else
    for t in "$BUILD"/tests/*; do [ -f "$t" ] && [ -x "$t" ] && run_one "$(basename "$t")" "$t"; done
    for t in tests/integration/*.sh tests/integration/*.py; do
        [ -f "$t" ] || continue
        case "$t" in *.py) run_one "$t" python3 "$t" ;; *) run_one "$t" sh "$t" ;; esac
    done
fi
rm -f "$log"
echo "$passed passed, $failed failed"
[ "$failed" = 0 ]
