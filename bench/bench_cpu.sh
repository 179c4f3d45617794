#!/usr/bin/env bash
# bench_cpu.sh - `make bench-cpu`: pretrain_gpt's tokens/s on the CPU beside llm.c's CPU trainer,
# measured in the same run, and the GEMM table (build/bench/gemm_bench).
#
#   shapes  L4:   4 layers, hidden 128, 4 heads, seq 128, vocab 512, micro-batch 4
#           124M: GPT-2 124M (12 layers, hidden 768, 12 heads, vocab 50257), seq 64, micro-batch 4
#   rows    megatron_c: 1 and 2 ranks (DP: micro-batch 4 per rank) x 1 and 2 threads per rank
#           (MC_CPU_THREADS); llm.c: 1 and 2 OpenMP threads (OMP_NUM_THREADS), batch 4
#   rounds  every row runs once per round, rounds one after another (BENCH_ROUNDS: default 2
#           for L4, 1 for 124M), so each row sees the load the others saw; the cell is the
#           median step time over every round's steps
#
# Each run trains BENCH_STEPS + 1 steps (forward, backward, optimizer); the first is dropped.
# megatron_c: Megatron's defaults (AdamW, grad-norm clipping at 1.0) with dropout off, fp32.
# llm.c: LLMC_DRIVER (default /tmp/llmc/llmc_bench), a program built outside this repository
# around llm.c's train_gpt2.c with the interface "DRIVER L C NH V T B STEPS MAXT" that times
# gpt2_forward + zero_grad + backward + update per step and prints "llmc step N: ... X ms";
# else LLMC=path of train_gpt2 itself (llm.c's own Makefile), whose main trains B=4, T=64 on
# ./gpt2_124M.bin after a validation pass: the L4 shape then runs at T=64 (and so does an extra
# megatron_c row beside it). Its input files (random weights, random tokens) are written by
# bench/llmc_inputs.c. BENCH_CONFIGS: the megatron_c rows, RANKSxTHREADS (default
# "1x1 1x2 2x1 2x2"); BENCH_SHAPES: "L4 124M".
set -u
cd "$(dirname "$0")/.."
STEPS=${BENCH_STEPS:-6}
ROUNDS=${BENCH_ROUNDS:-}
LLMC=${LLMC:-/tmp/llmc/train_gpt2}
LLMC_DRIVER=${LLMC_DRIVER:-/tmp/llmc/llmc_bench}
MPIRUN=${MPIRUN:-mpirun --oversubscribe}
SHAPES=${BENCH_SHAPES:-"L4 124M"}
work=$(mktemp -d "${TMPDIR:-/tmp}/mc_bench_cpu.XXXXXX")
trap 'rm -rf "$work"' EXIT
have_llmc=0
[ -x "$LLMC" ] && have_llmc=1
have_driver=0
[ -n "$LLMC_DRIVER" ] && [ -x "$LLMC_DRIVER" ] && have_driver=1
if [ $have_llmc = 1 ] && [ $have_driver = 0 ]; then   # train_gpt2 reads files; the driver not
    cc -std=c11 -O2 -o "$work/llmc_inputs" bench/llmc_inputs.c -lm || exit 1
fi

echo "## bench-cpu $(date -u '+%Y-%m-%d %H:%M UTC')"
echo "machine: $(lscpu | sed -n 's/^Model name: *//p' | head -1), $(nproc) cores online," \
     "$(awk '/MemTotal/ {printf "%.0f GiB", $2 / 1048576}' /proc/meminfo)"
echo "megatron_c: $(./build/bench/gemm_bench --describe 2>/dev/null | head -1)"
echo "llm.c: $([ $have_llmc = 1 ] && echo "$LLMC" || echo "not found (LLMC=$LLMC)")" \
     "$([ $have_driver = 1 ] && echo "driver $LLMC_DRIVER")"
echo "steps per run: $STEPS (+1 dropped)"
echo

median() { sort -g | awk '{v[NR] = $1} END {if (NR == 0) print "nan"; else if (NR % 2) print v[(NR + 1) / 2]; else print (v[NR / 2] + v[NR / 2 + 1]) / 2}'; }

# step milliseconds of one run, one per line, the first step dropped
mc_run() {   # mc_run RANKS THREADS FLAGS...
    local ranks=$1 threads=$2
    shift 2
    $MPIRUN --bind-to none -np "$ranks" env MC_CPU_THREADS="$threads" ./pretrain_gpt "$@" \
        --micro-batch-size 4 --global-batch-size $((4 * ranks)) --train-iters $((STEPS + 1)) \
        --log-interval 1 --lr 1e-4 --hidden-dropout 0 --attention-dropout 0 2>&1 |
        sed -n 's/.*elapsed time per iteration (ms): \([0-9.]*\).*/\1/p' | tail -n +2
}
llmc_run() {   # llmc_run THREADS DIR T  (train_gpt2 at T=64, or the driver)
    local threads=$1 dir=$2 T=$3
    if [ $have_driver = 1 ]; then
        OMP_NUM_THREADS=$threads "$LLMC_DRIVER" $(cat "$dir/shape") "$T" 4 $((STEPS + 1)) "$T" \
            2>&1 | sed -n 's/^llmc step \([0-9]*\):.* \([0-9.]*\) ms.*/\2/p' | tail -n +2
        return
    fi
    # train_gpt2 validates first (5 forwards), then trains; stop it after STEPS + 1 steps
    { (cd "$dir" && OMP_NUM_THREADS=$threads timeout 1200 stdbuf -oL "$LLMC" 2>&1) |
        sed -n 's/^step \([0-9]*\): train loss .* (took \([0-9.]*\) ms)/\1 \2/p' |
        awk -v n=$((STEPS + 1)) '{print $2; fflush()} NR >= n {exit}' | tail -n +2; } 2>/dev/null
}

for shape in $SHAPES; do
    case $shape in
    L4)   L=4 C=128 NH=4 V=512 T=128 MAXT=128 ;;
    124M) L=12 C=768 NH=12 V=50257 T=64 MAXT=1024 ;;
    *) echo "unknown shape $shape"; exit 2 ;;
    esac
    model="--num-layers $L --hidden-size $C --num-attention-heads $NH --vocab-size $V \
--max-position-embeddings $MAXT"
    llmc_T=$T
    [ "$T" != 64 ] && [ $have_driver = 0 ] && llmc_T=64
    rows=()
    for cfg in ${BENCH_CONFIGS:-1x1 1x2 2x1 2x2}; do rows+=("mc ${cfg%x*} ${cfg#*x} $T"); done
    [ "$llmc_T" != "$T" ] && rows+=("mc 1 1 $llmc_T" "mc 1 2 $llmc_T")
    if [ $have_llmc = 1 ] || [ $have_driver = 1 ]; then
        mkdir -p "$work/$shape"
        if [ $have_driver = 0 ]; then "$work/llmc_inputs" "$work/$shape" $L $C $NH $V $MAXT || exit 1; fi
        echo "$L $C $NH $V" > "$work/$shape/shape"
        rows+=("llmc 1 1 $llmc_T" "llmc 1 2 $llmc_T")
    fi
    rounds=${ROUNDS:-$([ "$shape" = L4 ] && echo 2 || echo 1)}
    echo "### $shape: L$L h$C heads $NH V$V, micro-batch 4, $rounds round(s)"
    echo "load before: $(uptime | sed 's/.*load average/load average/')"
    for ((r = 1; r <= rounds; r++)); do
        for i in "${!rows[@]}"; do
            read -r who ranks threads t <<<"${rows[$i]}"
            if [ "$who" = mc ]; then
                mc_run "$ranks" "$threads" $model --seq-length "$t" >>"$work/$shape.$i"
            else
                llmc_run "$threads" "$work/$shape" "$t" >>"$work/$shape.$i"
            fi
        done
    done
    echo "load after:  $(uptime | sed 's/.*load average/load average/')"
    echo
    printf '| %-10s | %5s | %8s | %9s | %3s | %10s | %10s | %9s |\n' program ranks "thr/rank" \
        "total thr" T "ms / step" "tokens/s" "vs llm.c"
    printf '|%s|\n' "------------|-------|----------|-----------|-----|------------|------------|-----------"
    declare -A tps=()
    for i in "${!rows[@]}"; do
        read -r who ranks threads t <<<"${rows[$i]}"
        ms=$(median <"$work/$shape.$i")
        tps[$i]=$(awk -v ms="$ms" -v r="$ranks" -v t="$t" 'BEGIN {if (ms == "nan" || ms <= 0) print "nan"; else printf "%.1f", 4 * r * t / (ms / 1000)}')
        key="$who $threads $t"
        [ "$who" = llmc ] && eval "llmc_tps_${threads}_$t=${tps[$i]}"
    done
    for i in "${!rows[@]}"; do
        read -r who ranks threads t <<<"${rows[$i]}"
        ms=$(median <"$work/$shape.$i" | awk '{printf "%.1f", $1}')
        total=$((ranks * threads))
        ref_var="llmc_tps_$((total > 2 ? 2 : total))_$t"
        ref=${!ref_var:-nan}
        ratio=$(awk -v a="${tps[$i]}" -v b="$ref" 'BEGIN {if (a == "nan" || b == "nan" || b <= 0) print "-"; else printf "%.2fx", a / b}')
        name=$([ "$who" = mc ] && echo megatron_c || echo llm.c)
        printf '| %-10s | %5s | %8s | %9s | %3s | %10s | %10s | %9s |\n' "$name" "$ranks" \
            "$threads" "$total" "$t" "$ms" "${tps[$i]}" "$ratio"
    done
    unset tps
    echo
done

echo "### GEMM (build/bench/gemm_bench), GFLOP/s"
echo "load before: $(uptime | sed 's/.*load average/load average/')"
./build/bench/gemm_bench "${GEMM_SECONDS:-0.3}"
echo "load after:  $(uptime | sed 's/.*load average/load average/')"
