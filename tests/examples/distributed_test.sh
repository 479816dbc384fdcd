#!/usr/bin/env bash
# End-to-end check of the data-parallel example under mpirun with 2 ranks: the loss must fall
# clearly, the accuracy on the three spirals must be well above chance (33%), and both ranks
# must end with identical parameters; with --zero (sharded optimizer state) and with --fsdp (sharded
# parameters, gradients and state) every epoch's line is the same as without; a bad option is
# refused before MPI starts.
# usage: distributed_test.sh MPIEXEC DISTRIBUTED_TRAIN WORK_DIR
set -euo pipefail
mpiexec=$1 example=$2 work=$3
rm -rf "$work" && mkdir -p "$work" && cd "$work"
fail() { echo "FAIL: $*" >&2; exit 1; }
# as root in containers, and on shared memory and loopback only (docs/distributed.md)
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_btl=self,vader,tcp
export OMPI_MCA_btl_tcp_if_include=lo OMPI_MCA_oob_tcp_if_include=lo OMP_NUM_THREADS=1
export OMPI_MCA_btl_vader_single_copy_mechanism=none  # containers without ptrace refuse CMA

"$mpiexec" --oversubscribe -np 2 "$example" --epochs 30 --batch 30 --bucket-mb 0.01 | tee out.txt
first=$(sed -nE 's/^epoch 1 loss ([0-9.]+).*/\1/p' out.txt)
last=$(sed -nE 's/^epoch 30 loss ([0-9.]+) accuracy ([0-9.]+)%.*/\1/p' out.txt)
acc=$(sed -nE 's/^epoch 30 loss ([0-9.]+) accuracy ([0-9.]+)%.*/\2/p' out.txt)
[[ -n $first && -n $last && -n $acc ]] || fail "missing epoch lines"
awk -v a="$first" -v b="$last" 'BEGIN { exit !(b < 0.5 * a) }' || fail "the loss did not fall clearly ($first -> $last)"
awk -v a="$acc" 'BEGIN { exit !(a > 80) }' || fail "accuracy $acc% is not well above chance"
[[ $(grep -c 'parameters identical on all 2 ranks' out.txt) == 2 ]] || fail "the ranks' parameters differ"

"$mpiexec" --oversubscribe -np 2 "$example" --epochs 30 --batch 30 --bucket-mb 0.01 --zero > zero.txt
diff <(grep '^epoch' out.txt) <(grep '^epoch' zero.txt) || fail "--zero trained differently"
[[ $(grep -c 'parameters identical on all 2 ranks' zero.txt) == 2 ]] || fail "the ranks' parameters differ (--zero)"

"$mpiexec" --oversubscribe -np 2 "$example" --epochs 30 --batch 30 --fsdp > fsdp.txt
diff <(grep '^epoch' out.txt) <(grep '^epoch' fsdp.txt) || fail "--fsdp trained differently"
[[ $(grep -c 'parameters identical on all 2 ranks' fsdp.txt) == 2 ]] || fail "the ranks' parameters differ (--fsdp)"

set +e
"$example" --epochs 0 2>err.txt
rc=$?
set -e
[[ $rc != 0 ]] || fail "--epochs 0 was accepted"
grep -q -- '--epochs' err.txt || fail "the refusal does not name --epochs"
echo "distributed example OK"
