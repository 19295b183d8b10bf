#!/usr/bin/env bash
# One scripted GPU session: kernel and whole-model tests on CUDA, then the kernel benchmarks (ours
# vs fla-core, vLLM and SDPA in the same run), then the end-to-end benchmark. Run from the repo
# root on a CUDA machine with the anchors carried: a wheel folder (WHEELS, default .whl_srv from
# bench/device_wheels.sh: fla-core, transformers) and .vllm_min/ (bench/vendor_vllm_attention.sh). Logs go to $OUT (or /tmp/hybrid_sgl_bench).
#   bash bench/h200_run.sh [tests|kernels|mamba|moe|e2e ...]   (default: all)
set -uo pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/hybrid_sgl_bench}
mkdir -p "$OUT"
WHEELS=${WHEELS:-.whl_srv}
if compgen -G "$WHEELS/*.whl" > /dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site "$WHEELS"/*.whl
fi
export PYTHONPATH=$PWD:/tmp/site:$PWD/.vllm_min
parts=${*:-tests kernels mamba moe e2e}
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader | tee "$OUT/gpu.txt"
for part in $parts; do
  case $part in
    tests)
      timeout 300 python3 -m pytest -q -rf -p no:cacheprovider tests/kernels tests/gpu 2>&1 | tee "$OUT/tests.log" | tail -40 ;;
    kernels)
      timeout 300 python3 bench/gdn_kernels.py 2>&1 | tee "$OUT/gdn_kernels.md" | tail -30
      timeout 300 python3 bench/attention_kernels.py 2>&1 | tee "$OUT/attention_kernels.md" | tail -40 ;;
    mamba)
      timeout 120 python3 bench/ssd_bench.py 2>&1 | tee "$OUT/ssd_bench.md" | tail -25
      timeout 60 python3 bench/ssm_step_bench.py --no-tune 2>&1 | tee "$OUT/ssm_step_bench.md" | tail -20 ;;
    moe)
      timeout 200 python3 bench/moe_kernels.py 2>&1 | tee "$OUT/moe_kernels.md" | tail -20 ;;
    e2e)
      timeout 300 python3 bench/offline.py --batch 1,32 --prompt 512 --output 128 --out "$OUT/offline.json" 2>&1 \
        | tee "$OUT/offline.md" | tail -40 ;;
  esac
done
