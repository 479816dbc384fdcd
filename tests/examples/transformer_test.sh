#!/usr/bin/env bash
# End-to-end checks of the Transformer example on a generated English-like text, tokenized
# with strata-tokenize:
#   smoke   a tiny model trains: the loss falls clearly, the final validation loss beats the
#           unigram baseline the example prints, and the checkpoint and weights files exist;
#   resume  N steps straight equal N/2 steps, then --resume to N: the same loss at every
#           step and the same final weights; resuming with another --width fails, naming it.
# usage: transformer_test.sh smoke|resume TRANSFORMER STRATA_TOKENIZE WORK_DIR
set -euo pipefail
mode=$1 transformer=$2 tokenize=$3 work=$4
rm -rf "$work" && mkdir -p "$work" && cd "$work"

fail() { echo "FAIL: $*" >&2; exit 1; }

# Sentences from a small grammar (fixed seed): learnable within a few hundred steps.
RANDOM=7
det=(the a one every that this no some) adj=(old small green quiet happy bright lazy strange)
noun=(cat dog house river teacher garden story machine) verb=(sees finds likes paints follows builds reads keeps)
for f in a b; do
  for ((i = 0; i < 3000; i++)); do
    echo "${det[RANDOM % 8]} ${adj[RANDOM % 8]} ${noun[RANDOM % 8]} ${verb[RANDOM % 8]} ${det[RANDOM % 8]} ${noun[RANDOM % 8]}."
  done >"text-$f.txt"
done
"$tokenize" --out train.bin --val val.bin --val-fraction 0.1 text-a.txt text-b.txt

tiny=(--train-data train.bin --val-data val.bin --layers 2 --width 32 --heads 2 --context 32 --batch 4 --warmup 5
      --lr 1e-2 --min-lr 1e-3 --eval-batches 10 --sample-tokens 0 --threads 1)

losses() { tail -n +2 "$1" | cut -d, -f1,2; }  # step,loss of every row

if [[ $mode == smoke ]]; then
  "$transformer" "${tiny[@]}" --steps 150 --eval-every 50 --log-every 50 --sample-tokens 40 | tee out.txt
  [[ $(losses transformer_metrics.csv | wc -l) == 150 ]] || fail "expected 150 rows in the metrics CSV"
  # mean loss of the first and last 10 steps: the last must be lower by at least 1 nat
  losses transformer_metrics.csv | awk -F, 'NR <= 10 { a += $2 } NR > 140 { b += $2 }
    END { printf "first 10 steps %.3f, last 10 steps %.3f\n", a / 10, b / 10; exit !(a / 10 - b / 10 > 1.0) }' ||
    fail "the loss did not fall clearly"
  line=$(grep '^final validation loss' out.txt) || fail "no final validation line"
  val=$(sed -E 's/^final validation loss ([0-9.]+).*/\1/' <<<"$line")
  base=$(sed -E 's/.*unigram baseline ([0-9.]+).*/\1/' <<<"$line")
  awk -v v="$val" -v b="$base" 'BEGIN { exit !(v < b - 0.1) }' || fail "validation loss $val not below the baseline $base"
  [[ -s transformer.ckpt.safetensors ]] || fail "no checkpoint written"
  grep -aq '"h.1.mlp_proj.weight"' model.safetensors || fail "model.safetensors lacks the model's tensor names"
  echo "PASS: validation loss $val below the unigram baseline $base"
elif [[ $mode == resume ]]; then
  run=("${tiny[@]}" --steps 60 --eval-every 10 --log-every 10 --dropout 0.1)  # dropout draws from the default generator
  "$transformer" "${run[@]}" --checkpoint straight.ckpt --metrics straight.csv --weights straight.safetensors
  "$transformer" "${run[@]}" --checkpoint split.ckpt --metrics split.csv --weights split.safetensors --stop-after 30
  [[ $(losses split.csv | wc -l) == 30 ]] || fail "the stopped run did not stop after step 30"
  "$transformer" "${run[@]}" --checkpoint split.ckpt --metrics split.csv --weights split.safetensors --resume |
    tee resumed.txt
  grep -q 'resumed from split.ckpt at step 30' resumed.txt || fail "no resume line"
  [[ $(losses straight.csv | wc -l) == 60 ]] || fail "expected 60 rows"
  diff <(losses straight.csv) <(losses split.csv) || fail "the resumed run's losses differ"
  cmp straight.safetensors split.safetensors || fail "the resumed run's final weights differ"

  set +e
  "$transformer" "${run[@]}" --width 48 --checkpoint split.ckpt --metrics other.csv --weights other.safetensors \
    --resume 2>err.txt
  rc=$?
  set -e
  cat err.txt
  [[ $rc == 1 ]] || fail "resuming with another width exited with $rc, not 1"
  grep -q "width: '32' -> '48'" err.txt || fail "the error does not name the width"
  echo "PASS: 60 identical losses and weights after resuming at step 30"
else
  fail "unknown mode $mode"
fi
