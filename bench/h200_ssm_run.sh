#!/usr/bin/env bash
# The Mamba-family GPU pass in one call: SSD prefill and SSM step benchmarks against mamba_ssm's
# Triton kernels (same run), then the SSD/step kernel GPU tests and the Mamba-family models on
# CUDA through the Triton kernels vs HF float32. Run from the repo root with .whl/ carried
# (mamba_ssm, einops and transformers wheels). Logs go to $OUT.
DEFAULT_WHEELS=.whl . "$(dirname "$0")/device_env.sh"
timeout 100 python3 bench/ssd_bench.py 2>&1 | tee "$OUT/ssd_bench.md" | tail -25
timeout 45 python3 bench/ssm_step_bench.py --no-tune 2>&1 | tee "$OUT/ssm_step_bench.md" | tail -20
timeout 60 python3 -m pytest -q -rf -p no:cacheprovider tests/gpu/test_ssd_chunk_cuda.py tests/gpu/test_ssm_step_cuda.py \
  2>&1 | tee "$OUT/tests_kernels.log" | tail -5
timeout 120 python3 -m pytest -q -rf -p no:cacheprovider tests/gpu/test_model_cuda.py \
  -k "(bamba or granite or nemotron or falcon or jamba) and not torch" 2>&1 | tee "$OUT/tests_models.log" | tail -20
