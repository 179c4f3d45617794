#!/usr/bin/env bash
# The peers of `make bench-gpu`: PyTorch eager, torch.compile and Megatron-Core 0.16.1 (local
# spec) training GPT-2 124M and 350M on one GPU, one process per run, within one time budget.
#
#   bash bench/gpu/run_peers.sh            # on the GPU machine, from anywhere in the repository
#
# Prints one fixed-format line per run on stdout (fields: bench/gpu/peer_common.py):
#   BENCH impl=torch-eager model=124M tok_s=... mfu=... peak_gib=... ... status=ok
# A run that fails, outlives its cap or finds the budget spent still prints its line, with '-'
# for the numbers and status=fail-rcN / timeout-Ns / no-budget / no-megatron. Lines starting
# with '#' are context. JSON records are appended to $PEERS_JSON, each run's stdout and stderr
# kept in $PEERS_LOG_DIR. Exit status: 0 when every run printed status=ok, 1 otherwise, 2 when
# the settings are wrong or there is no usable GPU.
#
# Order: eager and Megatron-Core first (their cost is a few seconds of start-up plus the steps),
# torch.compile last (its compilation time is the one that varies). torch.compile compiles the
# whole model as one graph (impl=torch-compile) when enough budget is left for that, else each
# transformer block and the head on their own (impl=torch-compile-regional: the blocks share one
# compiled graph, so compile time is that of one block); PEERS_COMPILE_SCOPE forces one.
#
# Settings (environment):
#   PEERS_MODELS         "124M 350M"   models to run
#   PEERS_BATCH          16            micro-batch size
#   PEERS_WARMUP         5             untimed warm-up steps (torch.compile compiles in the first)
#   PEERS_STEPS          20            timed steps
#   PEERS_BUDGET_S       235           wall seconds for all runs; each run is capped by what is left
#   PEERS_COMPILE_SCOPE  auto          auto | model | blocks
#   PEERS_LOG_DIR        build/bench-gpu/peers
#   PEERS_JSON           $PEERS_LOG_DIR/peers.jsonl   (appended to)
#   PEERS_SITE           /tmp/site     where the Megatron-Core wheel found in .whl/ is installed
#                                      when megatron.core is not importable yet
#   PYTHON               python3
# torch.compile's caches go to build/bench-gpu/ (TORCHINDUCTOR_CACHE_DIR, TRITON_CACHE_DIR)
# unless set, so a later call on a machine that kept build/ compiles from the cache.
set -u

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)
py=${PYTHON:-python3}
models=${PEERS_MODELS:-"124M 350M"}
batch=${PEERS_BATCH:-16}
warmup=${PEERS_WARMUP:-5}
steps=${PEERS_STEPS:-20}
budget=${PEERS_BUDGET_S:-235}
compile_scope=${PEERS_COMPILE_SCOPE:-auto}
logdir=${PEERS_LOG_DIR:-$root/build/bench-gpu/peers}
json=${PEERS_JSON:-$logdir/peers.jsonl}
site=${PEERS_SITE:-/tmp/site}
seq=1024

# Seconds a run may take at most (start-up, model build, compilation, the steps; generous), and
# for a whole-model compile the least budget worth starting it with.
max_s() {
    case "$1:$2" in
        torch-eager:*) echo 60 ;;
        mcore-local:124M) echo 75 ;;
        mcore-local:*) echo 100 ;;
        torch-compile-regional:*) echo 90 ;;
        torch-compile:124M) echo 120 ;;
        torch-compile:*) echo 150 ;;
    esac
}
whole_graph_min_s() {
    case "$1" in 124M) echo 70 ;; *) echo 95 ;; esac
}

for v in batch warmup steps budget; do
    case "${!v}" in
        ''|*[!0-9]*) echo "run_peers.sh: PEERS_${v^^}='${!v}': must be a whole number" >&2; exit 2 ;;
    esac
done
case "$compile_scope" in
    auto|model|blocks) ;;
    *) echo "run_peers.sh: PEERS_COMPILE_SCOPE='$compile_scope': must be auto, model or blocks" >&2
       exit 2 ;;
esac
for model in $models; do
    case "$model" in
        124M|350M) ;;
        *) echo "run_peers.sh: PEERS_MODELS has '$model': must be 124M or 350M" >&2; exit 2 ;;
    esac
done

mkdir -p "$logdir" || exit 2
export TORCHINDUCTOR_CACHE_DIR=${TORCHINDUCTOR_CACHE_DIR:-$root/build/bench-gpu/inductor-cache}
export TRITON_CACHE_DIR=${TRITON_CACHE_DIR:-$root/build/bench-gpu/triton-cache}
start=$SECONDS

if ! facts=$("$py" -c 'import torch, sys
if not torch.cuda.is_available(): sys.exit("torch %s sees no CUDA device" % torch.__version__)
print("torch %s, CUDA %s, %s" % (torch.__version__, torch.version.cuda, torch.cuda.get_device_name(0)))' 2>&1); then
    echo "run_peers.sh: no usable GPU: $facts" >&2
    exit 2
fi

# Megatron-Core: importable already, or installed from the wheel carried in .whl/.
have_mcore=0
if "$py" -c 'import megatron.core' 2>/dev/null; then
    have_mcore=1
else
    wheels=("$root"/.whl/megatron_core-*.whl)
    if [ -e "${wheels[0]}" ]; then
        if [ ! -d "$site/megatron/core" ]; then
            "$py" -m pip install -q --no-index --no-deps --target "$site" "${wheels[@]}" >&2 \
                || echo "run_peers.sh: installing ${wheels[*]} into $site failed" >&2
        fi
        export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}"
        "$py" -c 'import megatron.core' 2>/dev/null && have_mcore=1
    fi
    [ $have_mcore = 1 ] || echo "run_peers.sh: megatron.core is not importable and $root/.whl/" \
        "holds no wheel that installs (pip download --no-deps megatron-core==0.16.1" \
        "--python-version 3.12 --only-binary=:all: -d .whl)" >&2
fi
mcore_version=absent
if [ $have_mcore = 1 ]; then
    mcore_version=$("$py" -c 'import megatron.core as m; print(m.__version__)' 2>/dev/null)
fi

echo "# peers: $facts; megatron.core $mcore_version; batch $batch, seq $seq," \
     "$warmup warm-up + $steps timed steps"
echo "# mfu (percent) = tok_s * (6*N + 12*L*h*T) / 989.4e12, N = 12*L*h^2 + V*h, V = 50304" \
     "(PaLM appendix B)"

failed=0
placeholder() {  # impl model status: the BENCH line of a run that produced none
    echo "BENCH impl=$1 model=$2 tok_s=- mfu=- peak_gib=- ms_step=- steps=$steps warmup=$warmup" \
         "batch=$batch seq=$seq params=- warmup_s=- loss_first=- loss_last=- status=$3"
    failed=1
}

run_one() {  # impl model
    local impl=$1 model=$2 script args cap left log rc line
    left=$((budget - (SECONDS - start)))
    case "$impl" in
        torch-eager)   script=torch_gpt.py; args=() ;;
        mcore-local)   script=mcore_gpt.py; args=() ;;
        torch-compile)
            script=torch_gpt.py
            if [ "$compile_scope" = blocks ] || { [ "$compile_scope" = auto ] &&
                    [ $left -lt "$(whole_graph_min_s "$model")" ]; }; then
                impl=torch-compile-regional; args=(--compile --compile-scope blocks)
            else
                args=(--compile --compile-scope model)
            fi ;;
    esac
    if [ "$impl" = mcore-local ] && [ $have_mcore = 0 ]; then
        placeholder "$impl" "$model" no-megatron; return
    fi
    if [ $left -lt 20 ]; then
        placeholder "$impl" "$model" no-budget; return
    fi
    cap=$(max_s "$impl" "$model")
    [ "$cap" -gt "$left" ] && cap=$left
    log="$logdir/$impl-$model"
    timeout --kill-after=10 "$cap" "$py" "$here/$script" "${args[@]}" --model "$model" \
        --batch "$batch" --seq "$seq" --warmup "$warmup" --steps "$steps" --json "$json" \
        >"$log.out" 2>"$log.err"
    rc=$?
    line=$(grep '^BENCH ' "$log.out" | tail -n 1)
    if [ -n "$line" ]; then
        echo "$line"
        case "$line" in *" status=ok") ;; *) failed=1 ;; esac
    elif [ $rc -eq 124 ] || [ $rc -eq 137 ]; then
        placeholder "$impl" "$model" "timeout-${cap}s"
    else
        placeholder "$impl" "$model" "fail-rc$rc"
    fi
    if [ $rc -ne 0 ]; then
        echo "run_peers.sh: $impl $model exited $rc (${cap}s cap); last lines of $log.err:" >&2
        tail -n 15 "$log.err" >&2
    fi
}

for impl in torch-eager mcore-local torch-compile; do
    for model in $models; do
        run_one "$impl" "$model"
    done
done
echo "# peers took $((SECONDS - start)) s; logs in $logdir, JSON records in $json"
exit $failed
