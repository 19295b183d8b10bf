#!/usr/bin/env bash
# Prefix cache on one H200 in one call: its CUDA tests (Triton kernels, decode graphs), then
# bench/prefix_cache.py with the cache on and off in the same run. Run from the repo root with the
# wheel folder carried (WHEELS, default .whl_srv; bench/device_wheels.sh fills it). Logs go to $OUT.
#   bash bench/h200_prefix_cache_run.sh [tests|offline|mamba|multiturn ...]   (default: all four)
. "$(dirname "$0")/device_env.sh"

for part in ${*:-tests offline mamba multiturn}; do
  case $part in
    tests)
      timeout 300 python3 -m pytest -q -rf -p no:cacheprovider tests/gpu/test_prefix_cache_cuda.py 2>&1 \
        | tee "$OUT/tests_prefix_cache_gpu.log" | tail -8 ;;
    offline)  # Qwen3.5-9B shape: hit TTFT, n = 8, shared prefix + long suffix, nothing shared
      timeout 300 python3 bench/prefix_cache.py offline --config configs/qwen3_5-9b-text \
        --shared-requests ${SHARED_REQUESTS:-500} --out "$OUT/prefix_cache_qwen3_5-9b.json" 2>&1 | quiet \
        | tee "$OUT/prefix_cache_qwen3_5-9b.log" | grep -E "memory plan|ratio|rror" ;;
    mamba)  # a Mamba2 family: hit TTFT and n = 8
      timeout 240 python3 bench/prefix_cache.py offline --config configs/nemotron_h-8b --cases ttft,n8 \
        --out "$OUT/prefix_cache_nemotron_h-8b.json" 2>&1 | quiet | tee "$OUT/prefix_cache_nemotron_h-8b.log" \
        | grep -E "memory plan|rror" ;;
    multiturn)  # 64 users x 8 turns over HTTP, against --disable-radix-cache
      timeout 280 python3 bench/prefix_cache.py multiturn --config configs/qwen3_5-9b-text \
        --out "$OUT/multiturn_qwen3_5-9b.json" 2>&1 | quiet | tee "$OUT/multiturn_qwen3_5-9b.log" | tail -4 ;;
  esac
done
