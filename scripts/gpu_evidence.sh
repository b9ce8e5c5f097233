#!/usr/bin/env bash
# The GPU runs the docs' headline figures come from, one part at a time, each part sized to about ten
# minutes on a fresh host (Triton compiling included) and each step bounded by `timeout`, so a step that
# hangs leaves the others' files behind:
#   stateful  the stateful cuda tests (two logs), then 512 real-time streams through StreamDecoder with a
#             stream's primes and flushes in a lane of their own and on the steps' stream, twice, the
#             order swapped (docs/stateful.md);
#   leads     512 real-time streams with work held to the default 50 ms lead against 70 ms, four runs
#             each way, one process a run, the order alternating (docs/stateful.md, "The steps' lead");
#   serving   scripts/serving_capacity_gpu.sh: the host path alone at 1,000 streams, the real engine at 512
#             through `streamdec serve` and through StreamDecoder (docs/serving-capacity.md);
#   kernels   whole fp16x3 decodes of 16 x 70 and 1 x 70, three repeats (docs/kernels.md);
#   switch    captured 256 x 4 and 512 x 4 steps and 16 x 70 and 1 x 70 decodes with the warp-specialized
#             convolution and with the Triton kernel everywhere, side by side in one run (docs/kernels.md);
#   convs     where the kernels' time goes: every convolution call of a 256 x 4 step at each launch shape,
#             both orientations for layers of up to 96 channels, and the kernel tables of 1 x 70 and
#             16 x 70 decodes (docs/kernels.md, "Open work").
# Usage: scripts/gpu_evidence.sh OUT_DIR PART...   (run from the repository root with the package
# importable: docs/development.md, "On a GPU host")
set -uo pipefail
out=${1:?usage: $0 OUT_DIR stateful|leads|serving|kernels|switch|convs ...}
shift
[ $# -gt 0 ] || { echo "usage: $0 OUT_DIR stateful|leads|serving|kernels|switch|convs ..." >&2; exit 2; }
py=${PYTHON:-python3}
export TORCHINDUCTOR_COMPILE_THREADS=1 PYTHONUNBUFFERED=1
mkdir -p "$out"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader > "$out/device.txt" 2>&1
lscpu 2>/dev/null | grep "Model name" >> "$out/device.txt"
failed="$out/failed.txt"
rm -f "$failed"
run() {  # run SECONDS LOG COMMAND...: the command's output to LOG, its exit code appended (and a failure
  # named in failed.txt, which also serves the steps run side by side in the background)
  local secs=$1 log=$2
  shift 2
  echo "== $(date -u +%T) $*"
  timeout "$secs" "$@" > "$log" 2>&1
  local rc=$?
  echo "rc=$rc" >> "$log"
  tail -n 3 "$log"
  [ "$rc" -eq 0 ] || echo "$log" >> "$failed"
}
for part in "$@"; do
  case $part in
    stateful)
      for file in test_stateful_cuda test_stateful_bits_cuda; do  # side by side: mostly Triton compiling
        name=${file#test_}
        run 380 "$out/tests-${name//_/-}.log" "$py" -m pytest -q -p no:cacheprovider -m cuda \
          "tests/gpu/$file.py" --durations=0 &
      done
      wait
      for modes in stateful,stateful-one-lane stateful-one-lane,stateful; do
        run 100 "$out/stateful-512-${modes%%,*}-first.log" "$py" scripts/bench_stateful.py --codec auk-24k \
          --streams 512 --modes "$modes" --seconds 5 --timeline --budget-s 90 \
          --out "$out/stateful-512-${modes%%,*}-first.json"
      done
      ;;
    leads)
      for run in 1 2 3 4; do  # the order alternating: 50 70 70 50
        for lead in 50 70; do
          [ $((run % 2)) -eq 1 ] || lead=$((120 - lead))
          run 150 "$out/stateful-512-step-lead-$lead-$run.log" "$py" scripts/bench_stateful.py --codec auk-24k \
            --streams 512 --modes stateful --seconds 5 --timeline --budget-s 110 --hold-lead-ms "$lead" \
            --out "$out/stateful-512-step-lead-$lead-$run.json"
        done
      done
      ;;
    serving)
      run 590 "$out/serving.log" bash scripts/serving_capacity_gpu.sh "$out" 1000 512
      ;;
    kernels)
      for repeat in 1 2 3; do
        run 200 "$out/decode-fp16x3-$repeat.log" "$py" scripts/bench_gpu.py --codec auk-24k --precision fp16x3 \
          --windows 70 --batches 16 1 --skip engine accuracy plain --budget-s 60 \
          --out "$out/decode-fp16x3-$repeat.json"
      done
      ;;
    switch)
      run 240 "$out/step-specialized-256x4-16x70.log" "$py" scripts/bench_step.py --codec auk-24k --buckets 256x4 \
        --whole 16x70 --modes packed triton-conv --out "$out/step-specialized-256x4-16x70.json"
      run 200 "$out/step-specialized-512x4-1x70.log" "$py" scripts/bench_step.py --codec auk-24k --buckets 512x4 \
        --whole 1x70 --modes packed triton-conv --out "$out/step-specialized-512x4-1x70.json"
      ;;
    convs)
      run 330 "$out/step-convs-256x4.log" "$py" scripts/bench_step_convs.py --codec auk-24k --buckets 256x4 \
        --variants channels_n --channels-n-max 96 --out "$out/step-convs-256x4.json"
      for batch in 1 16; do
        run 150 "$out/profile-fp16x3-${batch}x70.log" "$py" scripts/profile_decode.py --codec auk-24k --compiled \
          --batch "$batch" --frames 70 --precisions fp16x3 --rows 40 --out "$out/profile-fp16x3-${batch}x70.txt"
      done
      ;;
    *)
      echo "unknown part $part: stateful, leads, serving, kernels, switch or convs" >&2
      exit 2
      ;;
  esac
done
[ ! -s "$failed" ]
