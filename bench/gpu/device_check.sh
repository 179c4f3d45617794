#!/usr/bin/env bash
# bench/gpu/device_check.sh - one call on a bare GPU machine: build, check, benchmark.
#
#   bash bench/gpu/device_check.sh   # from anywhere; $OUT (or ./out) gets summary.txt, bench_lines.txt, logs.tar.gz
#
# Steps (each with its own time cap; a failing step is reported and the next one still runs):
#   1 env        the GPU, CUDA, cuDNN, NCCL, MPI and torch versions
#   2 build      CUDA=1 NO_DEPS=1: the library, megatron_c_cuda.cu, build/tests/gpu_check,
#                build/bench/mc_gpt_bench, pretrain_gpt (needs only CUDA, NCCL, MPI; cuDNN when
#                found, else CUDNN=0 and the own attention kernels)
#   3 ops        gpu_check ops / attention / dropout with MC_CUDA_SYNC_CHECK=1: every CUDA op
#                against the CPU, one line per op with max abs / rel error
#   4 model      gpu_check model: the whole GPT on CUDA against the CPU (fp32 1e-5, bf16)
#   5 curve      gpu_check curve: bf16 against fp32 over 200 steps on the GPU
#   6 recipe     pretrain_gpt on the GPU (fp32 against --cpu, then --bf16 --profile)
#   7 bench      bench/gpu/bench_gpu.sh: megatron_c 124M and 350M (GELU fused into the GEMMs),
#                124M again with MC_CUDA_FUSE=0 (impl=megatron_c-unfused), then the peers
#                (PyTorch eager, torch.compile, Megatron-Core) in what is left of the budget;
#                one table
# The last lines are a summary table (step, status, seconds, what it found). Total budget:
# DEVICE_BUDGET_S (default 450 s); the peers get what is left after the rest (DEVICE_PEERS=0
# skips them).
set -u
start=$SECONDS
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$root" || exit 2
# the logs go to a scratch folder; at the end $OUT gets summary.txt, bench_lines.txt and
# logs.tar.gz (the tool that fetches $OUT takes at most 8 files)
final=${OUT:-$root/out}
out=${DEVICE_LOG_DIR:-/tmp/device_check_logs}
rm -rf "$out"; mkdir -p "$out" "$final"
budget=${DEVICE_BUDGET_S:-450}
jobs=$(nproc 2>/dev/null || echo 8)
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
declare -a S_NAME S_STATUS S_SECS S_NOTE

step_begin() { echo; echo "+ [$(( SECONDS - start ))s] step $1: $2"; T0=$SECONDS; }
step_end() {   # name status note
    S_NAME+=("$1"); S_STATUS+=("$2"); S_SECS+=("$(( SECONDS - T0 ))"); S_NOTE+=("$3")
    echo "+ [$(( SECONDS - start ))s] step $1: $2${3:+ ($3)}"
    pack
}
pack() {   # what is there so far goes to $OUT after every step, in case the call is cut short
    [ -f "$out/bench_lines.txt" ] && cp "$out/bench_lines.txt" "$final/"
    tar -czf "$final/logs.tar.gz" -C "$out" . 2>/dev/null
}
left() { echo $(( budget - (SECONDS - start) )); }
run() {   # cap logfile cmd...: runs with a time cap, output to the log and (tail) to stdout
    local cap=$1 log=$2; shift 2
    echo "+ $*" | tee -a "$log"
    timeout --kill-after=10 "$cap" "$@" >>"$log" 2>&1
    local rc=$?
    [ $rc -eq 124 ] || [ $rc -eq 137 ] && echo "+ timed out after ${cap}s" | tee -a "$log"
    return $rc
}

# --- 1 env -------------------------------------------------------------------------------------
step_begin env "versions"
{
    nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv 2>&1
    nvcc --version 2>&1 | tail -n 2
    grep -h -m3 -E 'define CUDNN_(MAJOR|MINOR|PATCHLEVEL)' /usr/include/cudnn_version*.h \
        /usr/local/cuda/include/cudnn_version*.h 2>/dev/null
    grep -h -m3 -E 'define NCCL_(MAJOR|MINOR|PATCH) ' /usr/include/nccl.h 2>/dev/null
    mpicc --version 2>&1 | head -n 1
    python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, "cudnn", torch.backends.cudnn.version())' 2>&1
} >"$out/env.txt" 2>&1
cat "$out/env.txt"
step_end env ok "$(head -n 2 "$out/env.txt" | tail -n 1 | cut -c1-60)"

# --- 2 build -----------------------------------------------------------------------------------
step_begin build "make CUDA=1 NO_DEPS=1 (the library, the CUDA table, gpu_check, mc_gpt_bench, pretrain_gpt)"
cudnn_flags=()
cudnn_note="cuDNN from the system"
if ! echo '#include <cudnn.h>' | g++ -E -x c++ -I/usr/local/cuda/include - >/dev/null 2>&1; then
    # torch's wheels carry cuDNN: its headers and libraries can serve the build
    pyc=$(python3 -c 'import nvidia.cudnn, os; print(os.path.dirname(nvidia.cudnn.__path__[0] + "/"))' 2>/dev/null)
    if [ -n "$pyc" ] && [ -f "$pyc/include/cudnn.h" ]; then
        [ -e "$pyc/lib/libcudnn.so" ] || ln -sf "$(ls "$pyc"/lib/libcudnn.so.* | head -n 1)" "$pyc/lib/libcudnn.so" 2>/dev/null
        cudnn_flags=(CUDNN_HOME="$pyc")
        cudnn_note="cuDNN from $pyc"
    else
        cudnn_flags=(CUDNN=0)
        cudnn_note="no cuDNN headers: CUDNN=0 (own attention kernels)"
    fi
fi
echo "+ $cudnn_note"
targets="build/tests/gpu_check build/bench/mc_gpt_bench pretrain_gpt"
rm -f build/mc_impl.o build/megatron_c_cuda.o build/tests/gpu_check build/bench/mc_gpt_bench pretrain_gpt
if run 300 "$out/build.log" make -j"$jobs" CUDA=1 NO_DEPS=1 "${cudnn_flags[@]}" $targets; then
    step_end build ok "$cudnn_note"
else
    grep -E 'error|Error' "$out/build.log" | head -n 20
    if [ "${cudnn_flags[*]}" != "CUDNN=0" ]; then   # retry without cuDNN rather than stop
        echo "+ build failed; retrying with CUDNN=0"
        rm -f build/megatron_c_cuda.o
        run 200 "$out/build.log" make -j"$jobs" CUDA=1 NO_DEPS=1 CUDNN=0 $targets \
            && step_end build ok "with CUDNN=0 after a failed cuDNN build" \
            || step_end build FAIL "see build.log"
    else
        step_end build FAIL "see build.log"
    fi
fi
tail -n 3 "$out/build.log"

summary_of() { grep -E '^[0-9]+ passed, [0-9]+ failed' "$1" | tail -n 1; }

# --- 3 ops, 4 model, 5 curve --------------------------------------------------------------------
gpu_section() {   # step name, sections..., with sync check for the op sections
    local name=$1 sync=$2 cap=$3; shift 3
    local args=()
    for s in "$@"; do args+=(--section "$s"); done
    step_begin "$name" "gpu_check ${args[*]}${sync:+ (MC_CUDA_SYNC_CHECK=1)}"
    if [ ! -x build/tests/gpu_check ]; then step_end "$name" SKIP "not built"; return; fi
    if [ -n "$sync" ]; then
        # cuDNN's own log (warnings and errors: why a graph is refused) beside the op log
        run "$cap" "$out/gpu_check_$name.log" env MC_CUDA_SYNC_CHECK=1 CUDNN_LOGLEVEL_DBG=2 \
            CUDNN_LOGDEST_DBG="$out/cudnn_warnings.log" build/tests/gpu_check "${args[@]}"
    else
        run "$cap" "$out/gpu_check_$name.log" build/tests/gpu_check "${args[@]}"
    fi
    local rc=$?
    grep -E '^(  (PASS|FAIL|SKIP)|    \(|==|gpu_check|SKIP|FAIL|  +[0-9]+ +[0-9.-]+|megatron_c cuda)' "$out/gpu_check_$name.log"
    if [ -s "$out/cudnn_warnings.log" ] && [ -n "$sync" ]; then
        echo "+ cuDNN warnings: $(wc -l < "$out/cudnn_warnings.log") lines; the first reasons:"
        grep -iE 'reason|not.?supported|error' "$out/cudnn_warnings.log" | cut -c1-300 | head -n 16
    fi
    local sum; sum=$(summary_of "$out/gpu_check_$name.log")
    if [ $rc -eq 0 ]; then step_end "$name" ok "$sum"
    elif [ $rc -eq 77 ]; then step_end "$name" SKIP "no GPU"
    else step_end "$name" FAIL "${sum:-exit $rc}"; fi
}
gpu_section ops 1 150 ops attention dropout
gpu_section model "" 120 model
gpu_section curve "" 120 curve

# --- 6 recipe ------------------------------------------------------------------------------------
step_begin recipe "pretrain_gpt on the GPU: fp32 against --cpu, then --bf16 --profile"
if [ -x pretrain_gpt ]; then
    flags=(--num-layers 2 --hidden-size 128 --num-attention-heads 4 --seq-length 128
           --micro-batch-size 4 --global-batch-size 8 --lr 1e-3 --hidden-dropout 0
           --attention-dropout 0 --log-interval 1)
    run 60 "$out/recipe_gpu.log" ./pretrain_gpt "${flags[@]}" --train-iters 5
    r1=$?
    run 60 "$out/recipe_cpu.log" ./pretrain_gpt "${flags[@]}" --train-iters 5 --cpu
    r2=$?
    run 60 "$out/recipe_bf16.log" ./pretrain_gpt "${flags[@]}" --train-iters 30 --log-interval 10 --bf16 --profile
    r3=$?
    grep -h -E 'device|breakdown' "$out/recipe_gpu.log" "$out/recipe_bf16.log" | head -n 6
    echo "  iteration  loss(gpu fp32)  loss(cpu fp32)"
    paste <(grep -o 'lm loss: [0-9.E+-]*' "$out/recipe_gpu.log" | cut -d' ' -f3) \
          <(grep -o 'lm loss: [0-9.E+-]*' "$out/recipe_cpu.log" | cut -d' ' -f3) | nl -w 11 -s '  '
    grep -o 'iteration *[0-9]*/.*lm loss: [0-9.E+-]*' "$out/recipe_bf16.log" | sed 's/|.*lm loss/ bf16 lm loss/' | tail -n 3
    worst=$(paste <(grep -o 'lm loss: [0-9.E+-]*' "$out/recipe_gpu.log" | cut -d' ' -f3) \
                  <(grep -o 'lm loss: [0-9.E+-]*' "$out/recipe_cpu.log" | cut -d' ' -f3) |
            awk '{d=$1-$2; if (d<0) d=-d; r=d/($2>0?$2:1); if (r>w) w=r} END {printf "%.2e", w+0}')
    on_gpu=$(grep -c 'pretrain_gpt: device .*sm_' "$out/recipe_gpu.log")
    if [ "$on_gpu" = 0 ]; then
        step_end recipe FAIL "pretrain_gpt did not pick the GPU (see recipe_gpu.log)"
    elif [ $r1 -eq 0 ] && [ $r2 -eq 0 ] && [ $r3 -eq 0 ]; then
        step_end recipe ok "gpu vs cpu fp32 loss: max rel diff $worst over 5 iterations"
    else
        step_end recipe FAIL "exit codes gpu $r1, cpu $r2, bf16 $r3"
    fi
else
    step_end recipe SKIP "pretrain_gpt not built"
fi

# --- 7 memory ----------------------------------------------------------------------------------
step_begin memory "pretrain_gpt GPT-2 124M bf16 on the GPU: measured peak per category against mc_memory_estimate"
if [ -x pretrain_gpt ]; then
    run 90 "$out/memory_124m.log" ./pretrain_gpt --num-layers 12 --hidden-size 768 \
        --num-attention-heads 12 --seq-length 1024 --vocab-size 50257 --micro-batch-size 16 \
        --global-batch-size 16 --train-iters 2 --bf16 --log-interval 1
    rc=$?
    grep -A3 -E '^(pretrain_gpt: memory estimate|memory peak per rank)' "$out/memory_124m.log" | cut -c1-300
    row=$(grep -A2 '^memory peak per rank' "$out/memory_124m.log" | tail -n 1 | awk '{print $NF}')
    if [ $rc -eq 0 ] && [ -n "$row" ]; then
        step_end memory ok "measured/estimated all at once: $row bytes"
    else
        step_end memory FAIL "exit $rc (see memory_124m.log)"
    fi
else
    step_end memory SKIP "pretrain_gpt not built"
fi

# --- 8 lab12 -----------------------------------------------------------------------------------
# lab12 built with CUDA probes this machine and runs its CUDA op table (rank 0's GPU) against the
# CPU reference; it needs cJSON, cmark and libunistring, carried as .device-libs
# (../shared/device/pack-libs.sh) when the machine lacks them.
step_begin lab12 "lab12 (M012) built with CUDA: the probe, the smoke runs and the CUDA op table"
# (the carried headers through CPATH, not CPPFLAGS: a CPPFLAGS on make's command line would
# replace the Makefile's own, -DMC_ENABLE_CUDA with them)
L=$root/.device-libs
libflags=()
[ -d "$L" ] && export CPATH="$L/include:$L/include/cjson${CPATH:+:$CPATH}" \
    LIBRARY_PATH="$L/lib${LIBRARY_PATH:+:$LIBRARY_PATH}" &&
    libflags=(LDFLAGS="-L$L/lib -Wl,--disable-new-dtags,-rpath,$L/lib")
if run 120 "$out/lab12_build.log" make -j"$jobs" CUDA=1 NO_DEPS=1 "${cudnn_flags[@]}" "${libflags[@]}" lab12; then
    run 90 "$out/lab12.log" mpirun --allow-run-as-root --oversubscribe -np 4 ./lab12 \
        --answers "$out/lab12_answers.md" --results "$out/lab12.json"
    rc=$?
    grep -E '^(megatron_c|build|compiler|MPI|CUDA|devices|op tables|  *(cuda|nccl|gpu)|.*cuda_ops|.*nccl|.*CHECK|.*checks)' "$out/lab12.log" | head -n 40
    checks=$(grep -cE 'FAIL' "$out/lab12.log")
    if grep -q 'not in this build' "$out/lab12.log"; then
        step_end lab12 FAIL "lab12 was built without the CUDA table"
    else
        [ $rc -eq 0 ] && step_end lab12 ok "exit 0, $checks FAIL lines" || step_end lab12 FAIL "exit $rc"
    fi
else
    grep -E 'error' "$out/lab12_build.log" | head -n 10
    step_end lab12 FAIL "build failed (see lab12_build.log)"
fi

# --- 9 bench ---------------------------------------------------------------------------------------
step_begin bench "make bench-gpu's script: megatron_c 124M / 350M, then the peers"
if [ -x build/bench/mc_gpt_bench ]; then
    peers_budget=$(( $(left) - 150 ))   # megatron_c's three runs take about 80-120 s
    [ $peers_budget -gt 235 ] && peers_budget=235
    peers=1
    if [ $peers_budget -lt 40 ]; then peers=0; echo "+ only $(left) s left: the peers are skipped"; fi
    [ "${DEVICE_PEERS:-1}" = 0 ] && peers=0 && echo "+ DEVICE_PEERS=0: the peers are skipped"
    BENCH_PEERS=$peers PEERS_BUDGET_S=$peers_budget BENCH_LOG="$out/bench_lines.txt" \
        run $(( $(left) > 60 ? $(left) : 60 )) "$out/bench.log" bash bench/gpu/bench_gpu.sh
    rc=$?
    grep -E '^(# |BENCH|\||ratio|  #|bench_gpu|run_peers|mc_gpt_bench)' "$out/bench.log" | head -n 60
    echo "+ megatron_c fused and unfused (MC_CUDA_FUSE=0):"
    grep -E '^(  # megatron_c .* gelu fusion|BENCH impl=megatron_c(-unfused)? )' "$out/bench.log"
    note=$(grep -E '^BENCH impl=megatron_c(-unfused)? ' "$out/bench.log" |
           awk '{print $2, $3, $4, $5}' | sed 's/impl=//' | tr '\n' ';')
    [ $rc -eq 0 ] && step_end bench ok "$note" || step_end bench FAIL "${note:-exit $rc}"
else
    step_end bench SKIP "mc_gpt_bench not built"
fi

# --- summary ---------------------------------------------------------------------------------------
echo
echo "device_check: $(( SECONDS - start )) s"
{
    printf '%-8s %-6s %5s  %s\n' step status secs note
    for i in "${!S_NAME[@]}"; do
        printf '%-8s %-6s %5s  %s\n' "${S_NAME[$i]}" "${S_STATUS[$i]}" "${S_SECS[$i]}" "${S_NOTE[$i]}"
    done
} | tee "$out/summary.txt"
cp "$out/summary.txt" "$final/" 2>/dev/null
pack
echo "device_check: $final holds summary.txt, bench_lines.txt, logs.tar.gz"
grep -q 'FAIL' "$out/summary.txt" && exit 1
exit 0
