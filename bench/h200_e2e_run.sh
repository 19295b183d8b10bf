#!/usr/bin/env bash
# End-to-end GPU pass: whole-model CUDA tests, per-kernel decode profiles, and bench/offline.py
# with and without the overlap scheduler, in one call. Run from the repo root with a wheel folder
# carried (WHEELS, default .whl_gpu: transformers and friends; bench/device_wheels.sh fills .whl).
#   bash bench/h200_e2e_run.sh [tests|profile|offline|overlap|prefill|moe ...]   (default: all but moe)
# Logs go to $OUT (default /tmp/hybrid_sgl_bench).
set -uo pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/hybrid_sgl_bench}
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site ${WHEELS:-.whl_gpu}/*.whl
export PYTHONPATH=$PWD:/tmp/site
git log -1 --format='%H %s' 2>/dev/null > "$OUT/commit.txt"
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader | tee "$OUT/gpu.txt"
DENSE="qwen3_5-9b-text nemotron_h-8b"
OFF="--batch 1,32 --prompt 512 --output 128 --skip-hf"
for part in ${*:-tests profile offline overlap prefill}; do
  case $part in
    tests)
      timeout 150 python3 -m pytest -q -rf -p no:cacheprovider tests/gpu/test_model_cuda.py tests/gpu/test_overlap_cuda.py \
        2>&1 | tee "$OUT/tests_e2e.log" | tail -15 ;;
    profile)
      for c in $DENSE; do
        timeout 120 python3 bench/decode_profile.py --config "configs/$c" --batch 1 --top 40 2>&1 \
          | grep -v "^\[transformers\]" | tee "$OUT/profile_$c.md" | head -60
      done ;;
    offline|overlap)
      extra=""; [ "$part" = overlap ] && extra="--engine-arg enable_overlap_schedule=true"
      for c in $DENSE; do
        timeout 150 python3 bench/offline.py --config "configs/$c" $OFF $extra --out "$OUT/${part}_$c.json" 2>&1 \
          | grep -v "^\[transformers\]" | tee "$OUT/${part}_$c.md" | sed -n '/## Decode$/,/## End/p'
      done ;;
    prefill)
      timeout 200 python3 bench/offline.py --config configs/qwen3_5-9b-text --batch 1 --prompt 8192 --output 16 \
        --hf-batches 1 --out "$OUT/prefill_8192.json" 2>&1 | grep -v "^\[transformers\]" \
        | tee "$OUT/prefill_8192.md" | sed -n '/## Prefill$/,/## Decode step/p' ;;
    moe)
      for c in qwen3_5-35b-a3b-text qwen3_next-80b-a3b-24l granite_4_0-h-small; do
        timeout 150 python3 bench/offline.py --config "configs/$c" $OFF --out "$OUT/offline_$c.json" 2>&1 \
          | grep -v "^\[transformers\]" | tee "$OUT/offline_$c.md" | sed -n '/## Decode$/,/## End/p'
      done ;;
  esac
done
