#!/usr/bin/env bash
# End-to-end checks of the ResNet-50 example on the CPU:
#   - with 1000 classes the model has torchvision resnet50's 25,557,032 parameters;
#   - 8 SGD steps on one repeated batch of synthetic 64x64 images (4 classes) lower the loss
#     clearly, and the metrics CSV has one row per step;
#   - a channels-last run with Nesterov momentum starts from the same loss (same seed, same
#     weights, only the memory layout differs); LAMB also lowers the loss;
#   - a tiny ImageFolder of PNG files trains for 2 steps, validated on itself after each;
#   - 6 steps straight equal 3 steps (--stop-after), then --resume to 6, mid-epoch: the same
#     loss and lr at every step and byte-identical final checkpoints; the same for a
#     channels-last run, whose losses match the contiguous run's to 1e-4;
#   - integer options are decimal (010 is ten), --print-params-only counts an ImageFolder's classes;
#   - --amp on the CPU (bfloat16 autocast) starts from the full-precision loss to 0.02 and lowers
#     it clearly in 4 steps;
#   - --cudnn-benchmark on the CPU says it has no effect; a missing --data folder,
#     options that do not apply (--classes or --synthetic-size with --data, --eval-every without
#     --val-data, --momentum or --nesterov with LAMB), a hexadecimal --steps,
#     --resume without --checkpoint, a missing checkpoint, a resume with another batch size or
#     with --amp of a full-precision run,
#     --val-data without --data and
#     validation classes unlike the training ones fail with a message; so do outputs that name
#     each other or lie in a missing folder, a batch larger than the training set, non-finite or
#     out-of-range rates, --threads out of 0..1024 and a resume with another --steps,
#     --momentum or --label-smoothing; a run that
#     fails at its first step leaves the metrics CSV alone; a NaN loss stops without a checkpoint.
# usage: resnet50_test.sh RESNET50 WORK_DIR
set -euo pipefail
example=$1 work=$2
rm -rf "$work" && mkdir -p "$work" && cd "$work"

fail() { echo "FAIL: $*" >&2; exit 1; }

count_params() { "$example" --print-params-only "$@" | sed -nE 's/^parameters: ([0-9]+)$/\1/p'; }
params=$(count_params)
[[ $params == 25557032 ]] || fail "ResNet-50 with 1000 classes has $params parameters, not 25557032"

tiny=(--image-size 64 --classes 4 --synthetic-size 8 --batch 8 --warmup 0 --lr 0.02 --zero-init-residual
      --device cpu --workers 1 --threads 2 --log-every 4)
losses() { tail -n +2 "$1" | cut -d, -f2; }

"$example" "${tiny[@]}" --steps 8 --metrics sgd.csv | tee out.txt
[[ $(losses sgd.csv | wc -l) == 8 ]] || fail "expected 8 rows in the metrics CSV"
grep -qE '^mean throughput [0-9.]+ images/s' out.txt || fail "no mean throughput line"
grep -q '23516228 parameters' out.txt || fail "the 4-class model should have 23516228 parameters"
first=$(losses sgd.csv | head -1) last=$(losses sgd.csv | tail -1)
# ln 4 = 1.386 at the start; the repeated batch is memorized down to the label-smoothing floor
awk -v a="$first" -v b="$last" 'BEGIN { exit !(a > 1.2 && a < 1.6 && a - b > 0.5) }' ||
  fail "SGD: the loss did not fall clearly ($first -> $last)"

"$example" "${tiny[@]}" --steps 2 --nesterov --channels-last --cudnn-benchmark --metrics cl.csv | tee cl.txt
grep -q 'cudnn-benchmark has no effect on cpu' cl.txt || fail "no note that --cudnn-benchmark does nothing on the CPU"
grep -q 'channels-last' cl.txt || fail "the channels-last run does not say so"
cl=$(losses cl.csv | head -1)
awk -v a="$first" -v b="$cl" 'BEGIN { d = a - b; exit !(d < 1e-4 && d > -1e-4) }' ||
  fail "channels-last changed the first loss ($first vs $cl)"

"$example" "${tiny[@]}" --steps 4 --optimizer lamb --lr 0.01 --metrics lamb.csv >/dev/null
lamb_first=$(losses lamb.csv | head -1) lamb_last=$(losses lamb.csv | tail -1)
awk -v a="$lamb_first" -v b="$lamb_last" 'BEGIN { exit !(a - b > 0.5) }' ||
  fail "LAMB: the loss did not fall clearly ($lamb_first -> $lamb_last)"

# --amp on the CPU: bfloat16 autocast; float32 master weights, so the run tracks full precision
"$example" "${tiny[@]}" --steps 4 --amp --metrics amp.csv | tee amp.txt
grep -q 'mixed precision: bfloat16 autocast' amp.txt || fail "the --amp run does not say it autocasts"
amp_first=$(losses amp.csv | head -1) amp_last=$(losses amp.csv | tail -1)
awk -v a="$first" -v b="$amp_first" -v c="$amp_last" \
  'BEGIN { d = a - b; exit !(d < 0.02 && d > -0.02 && b - c > 0.5) }' ||
  fail "--amp: first loss $amp_first against $first in full precision, last $amp_last"

# a tiny ImageFolder of PNGs (two colour classes, written with Python's standard library)
# goes through decoding, RandomResizedCrop, flips and normalization in the loader's workers
python3 - <<'EOF'
import os, random, struct, zlib
def png(path, w, h, rgb):
    raw = b''.join(b'\0' + bytes(rgb()[c] for x in range(w) for c in range(3)) for y in range(h))
    chunk = lambda t, d: struct.pack('>I', len(d)) + t + d + struct.pack('>I', zlib.crc32(t + d) & 0xffffffff)
    with open(path, 'wb') as f:
        f.write(b'\x89PNG\r\n\x1a\n' + chunk(b'IHDR', struct.pack('>IIBBBBB', w, h, 8, 2, 0, 0, 0))
                + chunk(b'IDAT', zlib.compress(raw)) + chunk(b'IEND', b''))
random.seed(3)
for cls, base in (('blue', (30, 30, 200)), ('red', (200, 30, 30))):
    os.makedirs(f'folder/{cls}', exist_ok=True)
    for i in range(4):
        png(f'folder/{cls}/{i}.png', 48, 40, lambda: tuple(min(255, c + random.randrange(40)) for c in base))
EOF
"$example" --data folder --val-data folder --eval-every 1 --image-size 32 --batch 4 --steps 2 --warmup 0 \
  --device cpu --workers 2 --threads 2 --log-every 1 --metrics folder.csv | tee folder.txt
grep -q '^data: 8 images of 32x32 from folder, 2 classes' folder.txt ||
  fail "the ImageFolder was not read as 8 images in 2 classes"
[[ $(losses folder.csv | wc -l) == 2 ]] || fail "expected 2 rows in the ImageFolder run's CSV"
losses folder.csv | awk '{ if (!($1 > 0 && $1 < 10)) bad = 1 } END { exit bad }' ||
  fail "ImageFolder losses out of range"
grep -qE '^validation at step 2: loss [0-9.]+  top-1 [0-9.]+%  top-5 100.00%  \(8 images\)$' folder.txt ||
  fail "no validation line after step 2 (with 2 classes, top-5 is 100%)"
# every row validated (--eval-every 1): loss, then top-1 and top-5 in percent
tail -n +2 folder.csv | awk -F, '{ if (!($6 > 0 && $7 >= 0 && $7 <= 100 && $8 == 100)) bad = 1 } END { exit bad }' ||
  fail "the metrics CSV lacks validation columns: $(cat folder.csv)"
mkdir -p other/green && cp folder/red/0.png other/green/
# the model an ImageFolder trains has one class per folder (2 here: 2048 * 2 + 2 in the fc)
[[ $(count_params --data folder) == 23512130 ]] || fail "--print-params-only ignored the folder's 2 classes"
# integer options are decimal: a leading zero is not octal
"$example" "${tiny[@]}" --steps 010 --stop-after 02 --log-every 1 --checkpoint zeros.ckpt --metrics zeros.csv |
  grep -q 'stopped after step 2 of 10' || fail "--steps 010 --stop-after 02 was not read as 10 and 2"

# exact resume: 2 batches per epoch, so the run stops in the middle of epoch 1
ck=(--synthetic-size 8 --batch 4 --warmup 1)
"$example" "${tiny[@]}" "${ck[@]}" --steps 6 --checkpoint straight.ckpt --metrics straight.csv >/dev/null
"$example" "${tiny[@]}" "${ck[@]}" --steps 6 --checkpoint split.ckpt --stop-after 3 --metrics split.csv |
  tee stopped.txt
grep -q 'stopped after step 3 of 6; continue with --resume' stopped.txt || fail "no stop line"
"$example" "${tiny[@]}" "${ck[@]}" --steps 6 --checkpoint split.ckpt --resume --metrics split.csv | tee resumed.txt
grep -q 'resumed from split.ckpt at step 3' resumed.txt || fail "no resume line"
diff <(cut -d, -f1-3 straight.csv) <(cut -d, -f1-3 split.csv) || fail "the resumed run's losses or lrs differ"
cmp straight.ckpt split.ckpt || fail "the resumed run's final checkpoint differs"

# channels-last, weights and optimizer state included: the same losses as the contiguous run to
# rounding (convolutions sum in another order), and an exact resume of its own
cl=(--channels-last --steps 6)
"$example" "${tiny[@]}" "${ck[@]}" "${cl[@]}" --checkpoint cl_straight.ckpt --metrics cl_straight.csv >/dev/null
paste -d, <(losses straight.csv) <(losses cl_straight.csv) |
  awk -F, '{ d = $1 - $2; if (d > 1e-4 || d < -1e-4) exit 1 }' ||
  fail "channels-last training drifted: $(losses straight.csv | tr '\n' ' ') vs $(losses cl_straight.csv | tr '\n' ' ')"
"$example" "${tiny[@]}" "${ck[@]}" "${cl[@]}" --checkpoint cl_split.ckpt --stop-after 3 --metrics cl_split.csv >/dev/null
"$example" "${tiny[@]}" "${ck[@]}" "${cl[@]}" --checkpoint cl_split.ckpt --resume --metrics cl_split.csv >/dev/null
diff <(cut -d, -f1-3 cl_straight.csv) <(cut -d, -f1-3 cl_split.csv) || fail "the channels-last resume differs"
cmp cl_straight.ckpt cl_split.ckpt || fail "the channels-last resumed run's final checkpoint differs"

# refused: a nonzero exit status (1 from the example, 105 from CLI11's option checks) and a
# message on stderr that contains NEEDLE; expect_refusal adds the tiny synthetic-data options
refused() {
  local what=$1 needle=$2 rc=0
  shift 2
  "$example" "$@" >/dev/null 2>err.txt || rc=$?
  [[ $rc == 1 || $rc == 105 ]] || fail "$what exited with $rc, not 1 or 105"
  grep -q -- "$needle" err.txt || fail "the refusal of $what does not say '$needle': $(cat err.txt)"
}
expect_refusal() {
  local what=$1 needle=$2
  shift 2
  refused "$what" "$needle" "${tiny[@]}" --steps 2 "$@"
}
folder_run=(--data folder --image-size 32 --batch 4 --steps 2 --warmup 0 --device cpu --threads 2 --metrics f.csv)
refused "--classes with --data" '--classes sets the classes of synthetic data' "${folder_run[@]}" --classes 4
refused "--synthetic-size with --data" '--synthetic-size applies to synthetic data' "${folder_run[@]}" \
  --synthetic-size 8
refused "--eval-every without --val-data" '--eval-every needs --val-data' "${folder_run[@]}" --eval-every 1
refused "a missing ImageFolder root" 'no-such-dir' "${folder_run[@]}" --data "$work/no-such-dir"
expect_refusal "--momentum with LAMB" 'apply to --optimizer sgd' --optimizer lamb --momentum 0.5
expect_refusal "--nesterov with LAMB" 'apply to --optimizer sgd' --optimizer lamb --nesterov
expect_refusal "--steps in hexadecimal" '0x10 is not a decimal integer' --steps 0x10
expect_refusal "--synthetic-size 2^40" '--synthetic-size' --synthetic-size 1099511627776
expect_refusal "--resume with another --label-smoothing" "label_smoothing: '0.1' -> '0'" "${ck[@]}" --steps 6 \
  --label-smoothing 0 --checkpoint split.ckpt --resume
expect_refusal "--resume without --checkpoint" 'need --checkpoint' --resume
expect_refusal "--resume from a missing checkpoint" 'no checkpoint at none.ckpt' --checkpoint none.ckpt --resume
expect_refusal "--resume with another batch size" 'batch' "${ck[@]}" --batch 2 --steps 6 --checkpoint split.ckpt --resume
expect_refusal "--resume with --amp of a full-precision run" "amp: (absent) -> 'yes'" "${ck[@]}" --steps 6 \
  --checkpoint split.ckpt --resume --amp
expect_refusal "--val-data without --data" 'needs --data' --val-data folder
refused "validation classes unlike the training ones" 'classes (green) differ' "${folder_run[@]}" --val-data other
expect_refusal "--resume with another --steps" "steps: '6' -> '8'" "${ck[@]}" --steps 8 --checkpoint split.ckpt --resume
# the optimizer's state carries momentum and weight decay: others would be ignored
expect_refusal "--resume with another --momentum" "momentum: '0.9' -> '0'" "${ck[@]}" --steps 6 --momentum 0 \
  --checkpoint split.ckpt --resume
expect_refusal "--checkpoint = --metrics" 'name the same file' --checkpoint sgd.csv --metrics sgd.csv
expect_refusal "--checkpoint in a missing folder" 'no folder nodir' --checkpoint nodir/x.ckpt
expect_refusal "--checkpoint naming a folder" 'is a folder' --checkpoint folder
expect_refusal "--batch larger than the training set" 'larger than the training set' --batch 16
expect_refusal "--batch 2^31" '--batch' --batch 2147483648
expect_refusal "--weight-decay inf" '--weight-decay' --weight-decay inf
expect_refusal "--min-lr above --lr" '--min-lr' --min-lr 1
expect_refusal "--momentum 2" '--momentum' --momentum 2
expect_refusal "--label-smoothing 1" '--label-smoothing' --label-smoothing 1
expect_refusal "--threads 100000" '--threads' --threads 100000
expect_refusal "--threads -1" '--threads' --threads -1
cp sgd.csv sgd.before
expect_refusal "a batch of 1 (BatchNorm)" 'BatchNorm' --batch 1 --image-size 32 --metrics sgd.csv
cmp sgd.csv sgd.before || fail "a run that failed at its first step changed the metrics CSV"
expect_refusal "a NaN loss" 'training loss is' --lr 1e308 --checkpoint nan.ckpt --metrics nan.csv
[[ ! -e nan.ckpt ]] || fail "a run whose loss became NaN saved a checkpoint"
echo "PASS: $params parameters; SGD loss $first -> $last; LAMB loss $lamb_first -> $lamb_last"
