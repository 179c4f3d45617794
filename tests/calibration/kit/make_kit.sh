#!/bin/bash
# make_kit.sh OUT ID LAB... : one author kit per lab and sheet id (h01 h02 ... from ID=h, N=3):
# a fresh nonce, its blank sheet, and a real default run of the lab for that nonce, printed
# output cut before its grading part (run_output.txt). The frozen run (run/results.json) is the one the sheet is
# later graded against. Run from the repository root after `make labs`.
#   tests/calibration/kit/make_kit.sh /tmp/kit h lab01 lab04
set -eu
out=$1; prefix=$2; shift 2
n=${KIT_SHEETS:-3}
declare -A NP=([lab01]=2 [lab02]=4 [lab03]=8 [lab04]=8 [lab05]=4 [lab06]=2 [lab07]=8 [lab08]=8
               [lab09]=8 [lab10]=2 [lab11]=4 [lab12]=4)
root=$(pwd)
for lab in "$@"; do
  for i in $(seq 1 "$n"); do
    id=$(printf "%s%02d" "$prefix" "$i"); d=$out/$lab/$id; mkdir -p "$d"
    nonce=$(od -An -N3 -tx1 /dev/urandom | tr -d ' \n')
    "$root/$lab" --init --answers "$d/blank.md" --nonce "$nonce" > /dev/null
    # the run and all it leaves stay in run/: the author reads only blank.md and run_output.txt
    mkdir -p "$d/run"; cp "$d/blank.md" "$d/run/sheet.md"
    mpirun --allow-run-as-root --oversubscribe -np "${NP[$lab]}" "$root/$lab" --nonce "$nonce" \
      --answers "$d/run/sheet.md" --results "$d/run/results.json" > "$d/run/output.txt" 2>&1 || true
    # the author sees the measurements, not the grading of an empty sheet nor its ledger notes
    awk '/^== Grading/{exit} {print}' "$d/run/output.txt" |
      grep -v -e '^predictions at run time' -e '^ledger: ' -e '^  to predict for real' > "$d/run_output.txt"
    echo "$nonce" > "$d/nonce"
    echo "$lab $id nonce $nonce"
  done
done
