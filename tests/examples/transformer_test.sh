#!/usr/bin/env bash
# End-to-end checks of the Transformer example on a generated English-like text, tokenized
# with strata-tokenize:
#   smoke   a tiny model trains: the loss falls clearly, the final validation loss beats the
#           unigram baseline the example prints, and the checkpoint and weights files exist;
#           with --amp (bfloat16 autocast on the CPU) it starts from the same loss to 0.01 and
#           beats the baseline too; --profile writes a Chrome trace of a few steps, prints the op
#           table and leaves the losses unchanged;
#   resume  N steps straight equal N/2 steps, then --resume to N: the same loss at every
#           step and the same final weights; resuming with another --width fails, naming it.
#           bad options are refused before anything is written, naming the option: model
#           shapes, outputs that name an input or each other or lie in a missing folder, non-finite
#           or out-of-range rates, --threads; a run whose loss turns NaN stops without saving;
#           strata-tokenize refuses an output that is one of its inputs;
#   resume  also: resuming with another --steps, --weight-decay, --batch or --seed, or with --amp
#           from a full-precision run, is refused; an --amp run resumes exactly too;
#           resuming at the end runs nothing.
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

# refused: exit status 1 and a message on stderr that contains NEEDLE
expect_refusal() {
  local what=$1 needle=$2 rc=0
  shift 2
  "$transformer" "${tiny[@]}" --steps 3 --warmup 1 "$@" >/dev/null 2>err.txt || rc=$?
  [[ $rc == 1 ]] || fail "$what exited with $rc, not 1"
  grep -q -- "$needle" err.txt || fail "the refusal of $what does not say '$needle': $(cat err.txt)"
}

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
  "$transformer" "${tiny[@]}" --steps 150 --eval-every 50 --log-every 50 --amp --metrics amp.csv --weights amp.st \
    --checkpoint amp.ckpt | tee amp.txt
  grep -q 'mixed precision: bfloat16 autocast' amp.txt || fail "the --amp run does not say it autocasts"
  first=$(losses transformer_metrics.csv | head -1 | cut -d, -f2) amp_first=$(losses amp.csv | head -1 | cut -d, -f2)
  awk -v a="$first" -v b="$amp_first" 'BEGIN { d = a - b; exit !(d < 0.01 && d > -0.01) }' ||
    fail "--amp: the first loss $amp_first differs from full precision's $first"
  amp_val=$(sed -nE 's/^final validation loss ([0-9.]+).*/\1/p' amp.txt)
  awk -v v="$amp_val" -v b="$base" 'BEGIN { exit !(v < b - 0.1) }' ||
    fail "--amp: validation loss $amp_val not below $base"
  grep -aq '"h.1.mlp_proj.weight"' model.safetensors || fail "model.safetensors lacks the model's tensor names"

  # --profile: a few steps recorded, their trace written and the op table printed; losses unchanged
  "$transformer" "${tiny[@]}" --steps 12 --metrics plain.csv --weights plain.st --checkpoint plain.ckpt >/dev/null
  "$transformer" "${tiny[@]}" --steps 12 --metrics prof.csv --weights prof.st --checkpoint prof.ckpt \
    --profile trace.json | tee prof.txt
  grep -q 'Self CPU %' prof.txt || fail "--profile printed no op table"
  [[ "$(losses plain.csv)" == "$(losses prof.csv)" ]] || fail "--profile changed the losses"
  python3 - trace.json <<'PY' || fail "trace.json is not a Chrome trace of the profiled steps"
import json, sys
events = [e for e in json.load(open(sys.argv[1]))["traceEvents"] if e["ph"] == "X"]
names = {e["name"] for e in events}
assert {"ProfilerStep#6", "ProfilerStep#8", "linear", "attention"} <= names, names
assert all(e["dur"] >= 0 and e["ts"] >= 0 for e in events)
PY
  expect_refusal "--profile in a missing folder" 'there is no folder' --profile missing/trace.json

  cp transformer_metrics.csv metrics.before && cp val.bin val.before && cp model.safetensors weights.before
  expect_refusal "--width 0" '--width' --width 0
  expect_refusal "--heads 0" '--heads' --heads 0
  expect_refusal "--heads 3 with width 32" '--heads' --heads 3
  expect_refusal "--layers 2^31" '--layers' --layers 2147483648
  expect_refusal "a model of 5e10 parameters" 'at most 1e9 parameters' --layers 1024 --width 2048
  expect_refusal "--batch 0" '--batch' --batch 0
  expect_refusal "--batch 2^31" '--batch' --batch 2147483648
  expect_refusal "--metrics on the validation shard" 'would overwrite the input --val-data' --metrics val.bin
  expect_refusal "--weights on the training shard" 'would overwrite the input --train-data' --weights train.bin
  expect_refusal "--checkpoint = --weights" 'name the same file' --checkpoint x.st --weights x.st
  expect_refusal "--checkpoint = --metrics" 'name the same file' --checkpoint x.csv --metrics x.csv
  expect_refusal "--weights in a missing folder" 'no folder nodir' --weights nodir/w.st
  expect_refusal "--checkpoint naming a folder" 'is a folder' --checkpoint .
  expect_refusal "an empty --weights" '--weights is empty' --weights ''
  expect_refusal "--weights on a device" 'not a regular file' --weights /dev/null
  expect_refusal "--sample-tokens 1e12" '--sample-tokens' --sample-tokens 1000000000000
  expect_refusal "--lr inf" '--lr' --lr inf
  expect_refusal "--weight-decay inf" '--weight-decay' --weight-decay inf
  expect_refusal "--min-lr above --lr" '--min-lr' --min-lr 1
  expect_refusal "--min-lr nan" '--min-lr' --min-lr nan
  expect_refusal "--threads 100000" '--threads' --threads 100000
  expect_refusal "--threads -1" '--threads' --threads -1
  expect_refusal "--steps 0" '--steps' --steps 0
  expect_refusal "--warmup past --steps" '--warmup' --warmup 5
  expect_refusal "--warmup -1" '--warmup' --warmup -1
  expect_refusal "--stop-after -1" '--stop-after' --stop-after -1
  expect_refusal "--sample-tokens -1" '--sample-tokens' --sample-tokens -1
  expect_refusal "--clip -1" '--clip' --clip -1
  expect_refusal "--cuda-graphs on the CPU" '--cuda-graphs needs a GPU' --cuda-graphs --device cpu
  expect_refusal "--clip nan" '--clip' --clip nan
  expect_refusal "--dropout 1" '--dropout' --dropout 1
  expect_refusal "--temperature nan" '--temperature' --temperature nan
  expect_refusal "--temperature -1" '--temperature' --temperature -1
  expect_refusal "--top-k 0" '--top-k' --top-k 0
  expect_refusal "--top-k past the vocabulary" '--top-k' --top-k 100000
  rc=0  # integer options are decimal: CLI11 would read 0x4 as 4 (and 010 as 8)
  "$transformer" "${tiny[@]}" --steps 3 --warmup 1 --batch 0x4 >/dev/null 2>err.txt || rc=$?
  [[ $rc == 105 ]] && grep -q '0x4 is not a decimal integer' err.txt || fail "--batch 0x4 was not refused: $(cat err.txt)"
  cmp transformer_metrics.csv metrics.before || fail "a refused run changed the metrics CSV"
  cmp val.bin val.before || fail "a refused run changed the validation shard"
  cmp model.safetensors weights.before || fail "a refused run changed the weights"
  expect_refusal "a NaN loss" 'training loss is' --lr 1e308 --checkpoint nan.ckpt --weights nan.st --metrics nan.csv
  [[ ! -e nan.st && ! -e nan.ckpt ]] || fail "a run whose loss became NaN saved its weights"
  "$transformer" "${tiny[@]}" --steps 1 --warmup 0 --sample-tokens 20 --temperature 0 --metrics g.csv --weights g.st \
    --checkpoint g.ckpt >greedy.txt || fail "--temperature 0 (greedy) failed"
  grep -q -- '--- sample ---' greedy.txt || fail "--temperature 0 printed no sample"
  # a tiny temperature is greedy too (the logits divided by it had overflowed to NaN weights)
  "$transformer" "${tiny[@]}" --steps 1 --warmup 0 --sample-tokens 20 --temperature 1e-320 --top-k 256 \
    --metrics g.csv --weights g.st --checkpoint g.ckpt >tiny_t.txt || fail "--temperature 1e-320 failed"
  diff <(sed -n '/--- sample ---/,$p' greedy.txt) <(sed -n '/--- sample ---/,$p' tiny_t.txt) ||
    fail "--temperature 1e-320 did not sample as greedy decoding does"

  cp text-a.txt text.before
  set +e
  "$tokenize" --out text-a.txt text-a.txt 2>err.txt
  rc=$?
  set -e
  [[ $rc == 2 ]] || fail "strata-tokenize writing over its input exited with $rc, not 2"
  grep -q 'is also an input file' err.txt || fail "strata-tokenize does not say the output is an input: $(cat err.txt)"
  cmp text-a.txt text.before || fail "strata-tokenize replaced its input"
  "$tokenize" --help >/dev/null || fail "strata-tokenize --help exited with $?"
  mkdir -p folder
  set +e
  "$tokenize" --out folder.bin folder 2>err.txt
  rc=$?
  set -e
  [[ $rc == 1 ]] && grep -q 'folder: is a folder' err.txt || fail "strata-tokenize on a folder: $rc, $(cat err.txt)"
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
  "$transformer" "${run[@]}" --amp --checkpoint amp_straight.ckpt --metrics amp_straight.csv --weights amp_straight.st
  "$transformer" "${run[@]}" --amp --checkpoint amp_split.ckpt --metrics amp_split.csv --weights amp_split.st \
    --stop-after 30
  "$transformer" "${run[@]}" --amp --checkpoint amp_split.ckpt --metrics amp_split.csv --weights amp_split.st --resume
  diff <(losses amp_straight.csv) <(losses amp_split.csv) || fail "the resumed --amp run's losses differ"
  cmp amp_straight.st amp_split.st || fail "the resumed --amp run's final weights differ"
  expect_refusal "resuming with --amp from a full-precision run" "amp: (absent) -> 'yes'" "${run[@]}" --amp \
    --checkpoint split.ckpt --metrics other.csv --weights other.safetensors --resume

  set +e
  "$transformer" "${run[@]}" --width 48 --checkpoint split.ckpt --metrics other.csv --weights other.safetensors \
    --resume 2>err.txt
  rc=$?
  set -e
  cat err.txt
  [[ $rc == 1 ]] || fail "resuming with another width exited with $rc, not 1"
  grep -q "width: '32' -> '48'" err.txt || fail "the error does not name the width"
  expect_refusal "resuming with another --steps" "steps: '60' -> '50'" "${run[@]}" --steps 50 --checkpoint split.ckpt \
    --metrics other.csv --weights other.safetensors --resume
  # the optimizer's state carries its weight decay: another would be ignored, so it is refused
  expect_refusal "resuming with another --weight-decay" "weight_decay: '0.1' -> '5'" "${run[@]}" --weight-decay 5 \
    --checkpoint split.ckpt --metrics other.csv --weights other.safetensors --resume
  # other batches (their size, or the seed of their windows) would not continue the run exactly
  expect_refusal "resuming with another --batch" "batch: '4' -> '8'" "${run[@]}" --batch 8 \
    --checkpoint split.ckpt --metrics other.csv --weights other.safetensors --resume
  expect_refusal "resuming with another --seed" "seed: '1337' -> '5'" "${run[@]}" --seed 5 \
    --checkpoint split.ckpt --metrics other.csv --weights other.safetensors --resume
  "$transformer" "${run[@]}" --checkpoint split.ckpt --metrics split.csv --weights split.safetensors --resume |
    tee again.txt
  grep -q 'nothing to run: the checkpoint is at step 60 of 60' again.txt || fail "a finished run resumed did not say so"
  [[ $(losses split.csv | wc -l) == 60 ]] || fail "resuming a finished run changed the metrics CSV"
  echo "PASS: 60 identical losses and weights after resuming at step 30"
else
  fail "unknown mode $mode"
fi
