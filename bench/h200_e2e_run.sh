#!/usr/bin/env bash
# End-to-end GPU pass in one call: whole-model CUDA tests, decode profiles, bench/offline.py
# (default settings, and without overlap), the 8192-token prefill against HF, the MoE configs, and
# bench/serving.py against a launched server. Run from the repo root with a wheel folder carried
# (WHEELS, default .whl_srv: fastapi/uvicorn/pydantic, transformers, fla-core; bench/device_wheels.sh
# fills it). Logs go to $OUT (default /tmp/hybrid_sgl_bench).
#   bash bench/h200_e2e_run.sh [tests|profile|offline|anchor|no-overlap|prefill|moe|serving ...]
# Default: tests offline prefill. Each offline config takes about a minute (batch 1 and 32,
# prompt 512, 128 output tokens); OFFLINE_ARGS replaces that case list, SERVING_ARGS is appended,
# PROFILE_BATCH (default 1) and PROFILE_CONFIGS (default: 9B and Nemotron-H) set what is profiled.
. "$(dirname "$0")/device_env.sh"
DENSE="qwen3_5-9b-text nemotron_h-8b"
OFF=${OFFLINE_ARGS:-"--batch 1,32 --prompt 512 --output 128 --skip-hf"}

offline() {  # offline NAME CONFIG [extra offline.py args]: decode / prefill / step-time tables
  local name=$1 config=$2
  shift 2
  timeout 180 python3 bench/offline.py --config "configs/$config" $OFF "$@" --out "$OUT/${name}_$config.json" 2>&1 \
    | grep -v "^\[transformers\]" | tee "$OUT/${name}_$config.md" | sed -n '/## Decode$/,/## End/p'
}

for part in ${*:-tests offline prefill}; do
  case $part in
    tests)
      timeout 200 python3 -m pytest -q -rf -p no:cacheprovider tests/gpu tests/kernels/test_norms.py \
        2>&1 | tee "$OUT/tests_gpu.log" | tail -15 ;;
    profile)
      for c in ${PROFILE_CONFIGS:-$DENSE}; do
        timeout 120 python3 bench/decode_profile.py --config "configs/$c" --batch "${PROFILE_BATCH:-1}" --top 30 2>&1 \
          | grep -v "^\[transformers\]" | tee "$OUT/profile_b${PROFILE_BATCH:-1}_$c.md" | head -45
      done ;;
    offline) for c in $DENSE; do offline offline "$c"; done ;;
    anchor)  # the decode targets against HF generate in one run (9B shape, batch 1 and 32)
      OFF="--batch 1,32 --prompt 512 --output 256" offline anchor qwen3_5-9b-text ;;
    no-overlap) for c in $DENSE; do offline no_overlap "$c" --engine-arg disable_overlap_schedule=true; done ;;
    prefill)
      OFF="--batch 1 --prompt 8192 --output 16 --hf-batches 1" offline prefill qwen3_5-9b-text ;;
    moe)
      for c in qwen3_5-35b-a3b-text qwen3_next-80b-a3b-24l granite_4_0-h-small; do offline offline "$c"; done ;;
    serving)  # issue 6's serving case: 256 concurrent requests, random 1k in / 256 out, 9B shape
      # dummy weights with the bundled tiny tokenizer standing in (prompts are sent as token ids)
      timeout 400 python3 bench/serving.py --launch "--model-path configs/qwen3_5-9b-text --load-format dummy \
          --tokenizer-path configs/default-tiny-qwen3_5 --context-length 2048 --log-level info" \
        --launch-log "$OUT/server.log" --num-prompts 256 --random-input-len 1024 --random-output-len 256 \
        --request-rate inf --warmup-requests 16 --out "$OUT/serving.json" ${SERVING_ARGS:-} 2>&1 | tee "$OUT/serving.txt"
      grep -E "memory plan|decode GEMMs|captured|rror" "$OUT/server.log" | tail -8 ;;
  esac
done
