#!/usr/bin/env bash
# bench/gpu/lab_device_run.sh - the labs on a machine with one GPU: built with CUDA, their
# ranks sharing the GPU (each rank its own CUDA table; the mpi world stages every collective
# through the host, since one NCCL communicator cannot hold two ranks of one GPU).
#
#   ../shared/device/pack-libs.sh            # here: cJSON, cmark, libunistring -> .device-libs
#   bash bench/gpu/lab_device_run.sh         # there, .device-libs carried; $OUT gets the logs
#
# Steps: env; build (CUDA=1 NO_DEPS=1 labs, staged_cases, gpu_check); determinism (gpu_check's
# deterministic table against the CPU and against itself run twice; then every op of section
# ops with MC_CUDA_DETERMINISTIC=1); staged (the staged
# collectives on the CUDA table, on 1, 2, 4 and 8 ranks: STAGED_NP); lab08 (8 ranks, --device cuda, each follow-up (LAB08_NONCES): the model on the GPU,
# completion times from CUDA events, one SVG timeline per rank); lab12 (4 ranks, plain, then
# twice with --device cuda: do two runs of one layout agree bit for bit on the GPU?); then every
# lab in LAB_SWEEP (default all twelve) at its README world with --device cuda, each capped at
# LAB_CAP_S seconds (FOCUS=0 skips every step before the sweep). $OUT gets summary.txt and logs.tar.gz (results, timelines, SVGs, logs).
set -u
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$root" || exit 2
final=${OUT:-$root/out}
log=${DEVICE_LOG_DIR:-/tmp/lab_device_logs}
rm -rf "$log" results; mkdir -p "$log" "$final"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
L=$root/.device-libs
if [ -d "$L" ]; then
    export CPATH="$L/include:$L/include/cjson${CPATH:+:$CPATH}"
    export LIBRARY_PATH="$L/lib${LIBRARY_PATH:+:$LIBRARY_PATH}"
    export LD_LIBRARY_PATH="$L/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
fi
summary=$log/summary.txt
: > "$summary"
note() { echo "$*" | tee -a "$summary"; }
step() {   # name seconds command...: runs it with a time cap, logs to $log/name.log
    local name=$1 cap=$2; shift 2
    local t0=$SECONDS
    timeout "$cap" "$@" > "$log/$name.log" 2>&1
    local rc=$?
    note "step $name: exit $rc in $(( SECONDS - t0 )) s"
    return $rc
}

{ nvidia-smi -L; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv;
  nvcc --version | tail -2; mpirun --version | head -1; } > "$log/env.log" 2>&1
note "$(head -1 "$log/env.log")"
step build 400 make -j"$(nproc)" CUDA=1 NO_DEPS=1 labs build/tests/staged_cases build/tests/gpu_check \
    || { tail -30 "$log/build.log"; }
if [ "${FOCUS:-1}" = 1 ]; then   # FOCUS=0: only the sweep
    step determinism 200 build/tests/gpu_check --section determinism
    grep -E "determin|INFO|FAIL|passed" "$log/determinism.log" | head -24 >> "$summary"
    MC_CUDA_DETERMINISTIC=1 step det_ops 200 build/tests/gpu_check --section ops
    note "  deterministic tables, op by op against the CPU: $(tail -1 "$log/det_ops.log")"
    grep -E "FAIL" "$log/det_ops.log" | head -8 >> "$summary"
    for np in ${STAGED_NP:-1 2 4 8}; do
        step staged_np$np 120 mpirun --oversubscribe -np "$np" build/tests/staged_cases cuda
        note "  $(tail -1 "$log/staged_np$np.log")"
    done
    for nonce in ${LAB08_NONCES:-000000 007bbc 003dde}; do   # follow-ups F1, F2, F3
        step lab08_$nonce 400 mpirun --oversubscribe -np 8 ./lab08 --device cuda --nonce "$nonce" \
            --answers "$log/lab08_$nonce.md" --results "results/lab08_$nonce.json"
        grep -E "follow-up F|broken mode|checks|FAILED|does not:|span completed" \
            "$log/lab08_$nonce.log" | head -20 >> "$summary"
    done
    step lab12_plain 200 mpirun --oversubscribe -np 4 ./lab12
    mkdir -p "$log/lab12_plain" && cp -r results/. "$log/lab12_plain/" 2>/dev/null
    step lab12_device 200 mpirun --oversubscribe -np 4 ./lab12 --device cuda
    grep -E "recompute against|check failed|cuda_ops " "$log/lab12_device.log" | head -6 >> "$summary"
    step lab12_device2 200 mpirun --oversubscribe -np 4 ./lab12 --device cuda --results results/lab12_again.json
    python3 bench/gpu/lab12_twice.py "$summary"
fi
declare -A NP=([01]=2 [02]=4 [03]=8 [04]=8 [05]=4 [06]=2 [07]=8 [08]=8 [09]=8 [10]=2 [11]=4 [12]=4)
for n in ${LAB_SWEEP:-01 02 03 04 05 06 07 08 09 10 11 12}; do
    ./lab$n --init --force > /dev/null 2>&1
    step sweep_lab$n "${LAB_CAP_S:-150}" mpirun --oversubscribe -np "${NP[$n]}" ./lab$n --device cuda \
        --results "results/sweep_lab$n.json"
    note "  $(grep -m1 -E 'check failed|cannot|error' "$log/sweep_lab$n.log" | cut -c1-200)"
done
cp -r results "$log/results" 2>/dev/null
cp "$summary" "$final/summary.txt"
tar czf "$final/logs.tar.gz" -C "$log" .
cat "$summary"
