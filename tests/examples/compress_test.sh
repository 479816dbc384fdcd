#!/usr/bin/env bash
# End-to-end check of the compression example: the distillation loss falls clearly, the student
# and the pruned student score well above chance (12.5%), shrinking lowers the parameter count,
# and the masked weights are still zero after fine-tuning (the sparsity asked for, exactly).
# usage: compress_test.sh COMPRESS WORK_DIR
set -euo pipefail
example=$1 work=$2
rm -rf "$work" && mkdir -p "$work" && cd "$work"

fail() { echo "FAIL: $*" >&2; exit 1; }

"$example" --steps 150 --hidden 64 --shrink 0.5 --sparsity 0.5 --threads 1 | tee out.txt
first=$(grep -m1 -E '^distill step' out.txt | sed -E 's/.*loss ([0-9.]+).*/\1/')
last=$(grep -E '^distill step' out.txt | tail -n 1 | sed -E 's/.*loss ([0-9.]+).*/\1/')
awk -v a="$first" -v b="$last" 'BEGIN { exit !(b < a / 4) }' ||
  fail "the distillation loss did not fall ($first -> $last)"
student=$(sed -nE 's/^student: ([0-9]+) parameters.*/\1/p' out.txt)
shrunk=$(sed -nE 's/^shrunk: .* ([0-9]+) parameters.*/\1/p' out.txt)
[[ -n $student && -n $shrunk ]] || fail "no parameter counts printed"
(( shrunk < student / 2 )) || fail "shrinking half the hidden units left $shrunk of $student parameters"
acc=$(sed -nE 's/^final: .*test accuracy ([0-9.]+)%.*/\1/p' out.txt)
[[ -n $acc ]] || fail "no final accuracy line"
awk -v a="$acc" 'BEGIN { exit !(a > 80) }' || fail "final test accuracy $acc% is not clearly above chance"
grep -qE '^final: .* 50\.00% of the weights zero' out.txt || fail "the masked weights did not stay zero"

rc=0
"$example" --shrink 2 >/dev/null 2>err.txt || rc=$?
[[ $rc == 105 ]] || fail "--shrink 2 exited with $rc, not 105"
echo "PASS: distillation loss $first -> $last, $student -> $shrunk parameters, final accuracy $acc%"
