#!/usr/bin/env bash
# tests/stop_rank.sh RANK PATTERN COMMAND... - stop one rank of a running MPI job (kill -STOP)
# and report how the job ends.
#
# Runs COMMAND (an mpirun line) in the background, waits until its output contains PATTERN
# (at most 120 s), finds the launched process whose OMPI_COMM_WORLD_RANK is RANK and sends it
# SIGSTOP. Then waits for mpirun and prints "stopped rank R (pid P); mpirun exited S after T s"
# followed by the job's output. A job still running 120 s after the stop is killed with its
# processes, and the line says "still running". Used by tests/test_train.c.
set -u
rank=$1 pattern=$2
shift 2
log=$(mktemp "${TMPDIR:-/tmp}/mc_stop.XXXXXX")
trap 'rm -f "$log"' EXIT
"$@" >"$log" 2>&1 &
job=$!
for _ in $(seq 1 1200); do
    grep -q -- "$pattern" "$log" && break
    kill -0 "$job" 2>/dev/null || break
    sleep 0.1
done
victim=""
children() {   # the processes whose parent is $1 (procps may not be installed)
    for stat in /proc/[0-9]*/stat; do
        awk -v parent="$1" '$4 == parent { print $1 }' "$stat" 2>/dev/null
    done
}
for pid in $(children "$job"); do
    r=$(tr '\0' '\n' <"/proc/$pid/environ" 2>/dev/null | sed -n 's/^OMPI_COMM_WORLD_RANK=//p')
    [ "$r" = "$rank" ] && victim=$pid
done
if [ -z "$victim" ]; then
    echo "stop_rank: no process of rank $rank found (pattern seen: $(grep -c -- "$pattern" "$log"))"
    kill -9 "$job" 2>/dev/null; wait "$job" 2>/dev/null; cat "$log"; exit 1
fi
kill -STOP "$victim"
t0=$(date +%s.%N)
status="still running"
for _ in $(seq 1 1200); do
    if ! kill -0 "$job" 2>/dev/null; then
        wait "$job"; status="exited $?"; break
    fi
    sleep 0.1
done
t1=$(date +%s.%N)
if [ "$status" = "still running" ]; then
    for pid in $(children "$job"); do kill -9 "$pid"; done
    kill -9 "$job" "$victim"
fi
awk -v r="$rank" -v p="$victim" -v s="$status" -v a="$t0" -v b="$t1" \
    'BEGIN { printf "stopped rank %s (pid %s); mpirun %s after %.1f s\n", r, p, s, b - a }'
cat "$log"
