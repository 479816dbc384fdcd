#!/usr/bin/env bash
# End-to-end check of the Fashion-MNIST example on a slice of the real data: two short epochs
# on 3072 training images must lower the training loss clearly and score well above chance
# (10%) on 1000 test images; the metrics CSV and the weights file must be written; a missing
# data folder must fail with a message pointing at scripts/setup.sh; bad options (outputs naming
# each other or in a missing folder, out-of-range rates, --threads, a negative limit) are refused
# naming the option, before the metrics CSV or the weights are touched; a NaN loss stops the run
# without saving weights; CLI refusals (--epochs 0 or 2^62, --seed -1 or 2^64, a hexadecimal
# --batch, an exponent) are short.
# usage: fashion_mnist_test.sh FASHION_MNIST WORK_DIR
set -euo pipefail
example=$1 work=$2
rm -rf "$work" && mkdir -p "$work" && cd "$work"

fail() { echo "FAIL: $*" >&2; exit 1; }

data=${STRATA_FASHION_MNIST_DIR:-/usr/share/datasets/fashion-mnist}
for f in train-images-idx3-ubyte.gz train-labels-idx1-ubyte.gz t10k-images-idx3-ubyte.gz t10k-labels-idx1-ubyte.gz; do
  [[ -f $data/$f ]] || fail "Fashion-MNIST is not installed ($data/$f is missing): run scripts/setup.sh"
done

"$example" --limit-train 3072 --limit-test 1000 --epochs 2 --batch 64 --log-every 4 --threads 1 | tee out.txt
[[ $(tail -n +2 fashion_mnist_metrics.csv | wc -l) == 2 ]] || fail "expected 2 rows in the metrics CSV"
# the mean loss of the first 4 steps against the mean training loss of the last epoch
first=$(grep -m1 -E '^epoch 1 +step' out.txt | sed -E 's/.*loss ([0-9.]+).*/\1/')
last=$(tail -n 1 fashion_mnist_metrics.csv | cut -d, -f2)
awk -v a="$first" -v b="$last" 'BEGIN { exit !(a - b > 0.5) }' || fail "the loss did not fall clearly ($first -> $last)"
acc=$(sed -nE 's/^final test accuracy ([0-9.]+)%.*/\1/p' out.txt)
[[ -n $acc ]] || fail "no final accuracy line"
awk -v a="$acc" 'BEGIN { exit !(a > 60) }' || fail "test accuracy $acc% is not clearly above chance"
grep -aq '"head.weight"' fashion_mnist.safetensors || fail "the weights file lacks the model's tensor names"

set +e
"$example" --data-dir "$work/no-such-dir" --epochs 1 2>err.txt
rc=$?
set -e
[[ $rc == 1 ]] || fail "a missing data folder exited with $rc, not 1"
grep -q 'scripts/setup.sh' err.txt || fail "the missing-data error does not point at scripts/setup.sh"
# refused: exit status 1 and a message on stderr that contains NEEDLE
expect_refusal() {
  local what=$1 needle=$2 rc=0
  shift 2
  "$example" --limit-train 256 --limit-test 100 --epochs 1 --batch 64 --threads 1 "$@" >/dev/null 2>err.txt || rc=$?
  [[ $rc == 1 ]] || fail "$what exited with $rc, not 1"
  grep -q -- "$needle" err.txt || fail "the refusal of $what does not say '$needle': $(cat err.txt)"
}
cp fashion_mnist_metrics.csv metrics.before && cp fashion_mnist.safetensors weights.before
expect_refusal "--weights = --metrics" 'name the same file' --weights fashion_mnist_metrics.csv \
  --metrics fashion_mnist_metrics.csv
expect_refusal "--weights in a missing folder" 'no folder nodir' --weights nodir/w.st
expect_refusal "--label-smoothing 2" '--label-smoothing' --label-smoothing 2
expect_refusal "--label-smoothing 1" '--label-smoothing' --label-smoothing 1
expect_refusal "--lr 0" '--lr' --lr 0
expect_refusal "--lr inf" '--lr' --lr inf
expect_refusal "--weight-decay inf" '--weight-decay' --weight-decay inf
expect_refusal "--threads 100000" '--threads' --threads 100000
expect_refusal "--threads -1" '--threads' --threads -1
expect_refusal "--limit-train -1" '--limit-train' --limit-train -1
cmp fashion_mnist_metrics.csv metrics.before || fail "a refused run changed the metrics CSV"
cmp fashion_mnist.safetensors weights.before || fail "a refused run changed the weights"
expect_refusal "a NaN loss" 'training loss is' --lr 1e308 --weights nan.st --metrics nan.csv
[[ ! -e nan.st ]] || fail "a run whose loss became NaN saved its weights"
# CLI11's refusals (exit status 105) say in a few words what is allowed
expect_cli_refusal() {
  local needle=$1 rc=0
  shift
  "$example" "$@" >/dev/null 2>err.txt || rc=$?
  [[ $rc == 105 ]] || fail "$* exited with $rc, not 105"
  grep -q -- "$needle" err.txt || fail "the refusal of $* does not say '$needle': $(cat err.txt)"
  [[ $(wc -c <err.txt) -lt 200 ]] || fail "the refusal of $* is long: $(cat err.txt)"
}
expect_cli_refusal '0 is not in 1..100000' --epochs 0
expect_cli_refusal 'not in 1..100000' --epochs 4611686018427387904
expect_cli_refusal '0x40 is not a decimal integer' --batch 0x40
expect_cli_refusal '1e3 is not a decimal integer' --limit-train 1e3
expect_cli_refusal 'not an integer in 0..2^64-1' --seed -1
expect_cli_refusal 'not an integer in 0..2^64-1' --seed 18446744073709551616
echo "PASS: loss $first -> $last, test accuracy $acc%"
