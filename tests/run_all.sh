#!/usr/bin/env bash
# tests/run_all.sh BIN... - run Criterion test binaries one after another and sum them up.
#
# Each binary runs with --jobs 1 (the multi-rank suites launch mpirun themselves; two of them
# side by side on a small machine only produce timeouts) and its output is shown as it comes.
# The counts come from Criterion's "Synthesis:" line; skipped tests are counted from a TAP
# report written next to it, because the Synthesis line leaves them out.
#
# The last line printed is exactly "N passed, N failed" (", N skipped" appended when any).
# Exit status: 0 only when no test failed or crashed, every binary exited 0 and every
# binary ran at least one test.
#
# Environment: CRITERION_OPTS   extra options for every binary (e.g. --filter='comm/*')
#              MC_TEST_BINARY_TIMEOUT  seconds one binary may take (default 900)
#              MC_TEST_RUNNER   a command each binary runs under (e.g. valgrind ...)

set -u

if [ "$#" -eq 0 ]; then
    echo "usage: $0 TEST_BINARY..." >&2
    exit 2
fi

binary_timeout=${MC_TEST_BINARY_TIMEOUT:-900}
total_passed=0
total_failed=0
total_skipped=0
problems=()

workdir=$(mktemp -d "${TMPDIR:-/tmp}/mc_run_all.XXXXXX") || exit 2
trap 'rm -rf "$workdir"' EXIT

for bin in "$@"; do
    name=$(basename "$bin")
    log="$workdir/$name.log"
    tap="$workdir/$name.tap"
    echo "==== $name"
    if [ ! -x "$bin" ]; then
        echo "$name: not found or not executable"
        total_failed=$((total_failed + 1))
        problems+=("$name: missing")
        continue
    fi

    # shellcheck disable=SC2086  # CRITERION_OPTS and MC_TEST_RUNNER are lists on purpose
    timeout --kill-after=10 "$binary_timeout" ${MC_TEST_RUNNER:-} \
        "$bin" --jobs 1 --short-filename --tap="$tap" ${CRITERION_OPTS:-} 2>&1 | tee "$log"
    status=${PIPESTATUS[0]}

    synthesis=$(grep -E 'Synthesis: Tested: [0-9]+' "$log" | tail -n 1)
    skipped=0
    if [ -f "$tap" ]; then
        skipped=$(grep -cE '^ok .*# SKIP' "$tap")
    fi
    total_skipped=$((total_skipped + skipped))

    if [ -z "$synthesis" ]; then
        echo "$name: no Synthesis line (exit status $status)"
        total_failed=$((total_failed + 1))
        problems+=("$name: no Synthesis line, exit status $status")
        continue
    fi

    tested=$(sed -E 's/.*Tested: ([0-9]+).*/\1/' <<<"$synthesis")
    passing=$(sed -E 's/.*Passing: ([0-9]+).*/\1/' <<<"$synthesis")
    failing=$(sed -E 's/.*Failing: ([0-9]+).*/\1/' <<<"$synthesis")
    crashing=$(sed -E 's/.*Crashing: ([0-9]+).*/\1/' <<<"$synthesis")
    # Criterion counts a crashed test among the failing ones too.
    total_passed=$((total_passed + passing))
    total_failed=$((total_failed + failing))

    if [ "$tested" -eq 0 ]; then
        echo "$name: ran no test ($skipped skipped)"
        total_failed=$((total_failed + 1))
        problems+=("$name: ran no test")
    elif [ "$status" -ne 0 ] && [ "$failing" -eq 0 ]; then
        # A non-zero exit with every test passing: the runner itself went wrong (or timed out).
        echo "$name: exited with status $status although no test failed"
        total_failed=$((total_failed + 1))
        problems+=("$name: exit status $status")
    elif [ "$failing" -gt 0 ]; then
        problems+=("$name: $failing failing ($crashing crashed)")
    fi
done

echo "===="
for p in "${problems[@]+"${problems[@]}"}"; do
    echo "  $p"
done
summary="$total_passed passed, $total_failed failed"
if [ "$total_skipped" -gt 0 ]; then
    summary="$summary, $total_skipped skipped"
fi
echo "$summary"
[ "$total_failed" -eq 0 ]
