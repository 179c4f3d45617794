#!/usr/bin/env bash
# make bench-gpu: megatron_c training GPT-2 124M and 350M on one GPU, then the peers of this
# directory (PyTorch eager, torch.compile, Megatron-Core: run_peers.sh) in the same call, and one
# table of every BENCH line with megatron_c's speed as a ratio to each peer.
#
#   bash bench/gpu/bench_gpu.sh          # after make CUDA=1 build/bench/mc_gpt_bench
#
# Settings (environment): BENCH_MODELS ("124M 350M"), BENCH_BATCH (16), BENCH_WARMUP (5),
# BENCH_STEPS (20), BENCH_PROFILE (1: one extra profiled step per model), BENCH_UNFUSED_MODELS
# ("124M": these models again with MC_CUDA_FUSE=0, impl=megatron_c-unfused; "" none),
# BENCH_PEERS (1: run run_peers.sh when it is there), PEERS_BUDGET_S (passed on), BENCH_LOG
# (build/bench-gpu/bench.txt: every BENCH line of this call, appended). Exit status: 0 when
# every megatron_c run printed status=ok.
set -u
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)
bin=${BENCH_BIN:-$root/build/bench/mc_gpt_bench}
models=${BENCH_MODELS:-"124M 350M"}
batch=${BENCH_BATCH:-16}
warmup=${BENCH_WARMUP:-5}
steps=${BENCH_STEPS:-20}
profile=${BENCH_PROFILE:-1}
unfused_models=${BENCH_UNFUSED_MODELS-124M}
log=${BENCH_LOG:-$root/build/bench-gpu/bench.txt}
mkdir -p "$(dirname "$log")"
lines=$(mktemp)
trap 'rm -f "$lines"' EXIT
status=0

if [ ! -x "$bin" ]; then
    echo "bench_gpu.sh: $bin is missing (make CUDA=1 build/bench/mc_gpt_bench)" >&2
    exit 2
fi
run_megatron_c() {   # model impl [env assignments...]: one run, its BENCH line to $lines
    local model=$1 impl=$2 extra=()
    shift 2
    [ "$profile" = 1 ] && extra=(--profile)
    out=$(env "$@" timeout --kill-after=10 150 "$bin" --model "$model" --batch "$batch" \
          --warmup "$warmup" --steps "$steps" "${extra[@]}" 2>&1)
    rc=$?
    echo "$out" | grep -v '^BENCH ' | sed 's/^/  /'
    line=$(echo "$out" | grep '^BENCH ' | tail -n 1)
    if [ -z "$line" ]; then
        line="BENCH impl=$impl model=$model tok_s=- mfu=- peak_gib=- ms_step=- steps=$steps warmup=$warmup batch=$batch seq=1024 params=- warmup_s=- loss_first=- loss_last=- status=fail-rc$rc"
    fi
    echo "$line"
    echo "$line" >>"$lines"
    case "$line" in *" status=ok") ;; *) status=1 ;; esac
}
for model in $models; do
    run_megatron_c "$model" megatron_c
done
# the same with GELU outside the GEMMs (MC_CUDA_FUSE=0): what the fusion is worth, and the
# numbers to fall back on if the fused path has to be switched off
for model in $unfused_models; do
    echo "# megatron_c $model with MC_CUDA_FUSE=0 (GELU as its own kernels):"
    run_megatron_c "$model" megatron_c-unfused MC_CUDA_FUSE=0
done

if [ "${BENCH_PEERS:-1}" = 1 ] && [ -f "$here/run_peers.sh" ]; then
    echo "# peers (bench/gpu/run_peers.sh):"
    PEERS_MODELS="$models" PEERS_BATCH="$batch" PEERS_WARMUP="$warmup" PEERS_STEPS="$steps" \
        bash "$here/run_peers.sh" | tee -a "$lines"
else
    echo "# peers: not run (BENCH_PEERS=${BENCH_PEERS:-1}; $here/run_peers.sh $( [ -f "$here/run_peers.sh" ] && echo present || echo absent))"
fi
cat "$lines" | grep '^BENCH ' >>"$log"

# One table: every BENCH line, and megatron_c's tokens/s over each peer's, per model.
python3 - "$lines" <<'PY' || awk '/^BENCH /' "$lines"
import sys
rows = []
for line in open(sys.argv[1]):
    if not line.startswith("BENCH "):
        continue
    kv = dict(f.split("=", 1) for f in line.split()[1:] if "=" in f)
    rows.append(kv)
cols = ["impl", "model", "tok_s", "mfu", "peak_gib", "ms_step", "loss_last", "status"]
print()
print("| " + " | ".join(cols) + " | vs megatron_c |")
print("|" + "---|" * (len(cols) + 1))
ours = {r["model"]: r for r in rows if r.get("impl", "") == "megatron_c"}
for r in rows:
    ratio = "-"
    me = ours.get(r.get("model"))
    try:
        if me and r is not me:
            ratio = "%.2fx" % (float(me["tok_s"]) / float(r["tok_s"]))
    except (KeyError, ValueError, ZeroDivisionError):
        pass
    print("| " + " | ".join(r.get(c, "-") for c in cols) + " | " + ratio + " |")
print()
print("ratio = megatron_c tok/s / the row's tok/s (same GPU, same call); goal: >= 590K tok/s at 124M "
      "and >= 211K at 350M, and above torch-eager in the same run")
PY
exit $status
