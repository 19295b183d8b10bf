#!/usr/bin/env bash
# The end-to-end benchmarks on a GPU machine: bench/offline.py on the real-shape configs and
# bench/serving.py against a launched server. Run from the repository root with .whl/ carried
# (bench/device_wheels.sh fills it); results go to $OUT (default /tmp/hybrid_sgl_bench).
#   bash bench/offline_device.sh offline [CONFIG_DIR ...]   # default: qwen3_5-9b-text
#   bash bench/offline_device.sh serving [CONFIG_DIR]       # default: qwen3_5-9b-text
#   bash bench/offline_device.sh all                        # offline 9B + Nemotron-H, then serving 9B
# Extra flags: OFFLINE_ARGS="--batch 1,32 --prompt 512" and SERVING_ARGS="--num-prompts 64" are
# appended to the offline.py / serving.py command lines. Each offline config takes a few minutes
# (all 6 cases + the HF anchor at batch 1 and 32); MoE configs decode eagerly until a fused MoE
# kernel lands, so give them a subset (OFFLINE_ARGS) if a command has a time limit.
set -uo pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/hybrid_sgl_bench}
mkdir -p "$OUT"
if compgen -G ".whl/*.whl" > /dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
fi
export PYTHONPATH=$PWD:/tmp/site
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader | tee "$OUT/gpu.txt"
git log -1 --format='%H %s' 2>/dev/null | tee "$OUT/commit.txt"

offline() {  # offline CONFIG_DIR
  python3 bench/offline.py --config "configs/$1" --out "$OUT/offline_$1.json" ${OFFLINE_ARGS:-} 2>&1 \
    | tee "$OUT/offline_$1.md" | grep -v "^\[transformers\]" | tail -60
}

serving() {  # serving CONFIG_DIR: 256 concurrent requests, random 1k in / 256 out (issue 6's serving target)
  # The tiny bundled tokenizer stands in for the real one: prompts are token ids, and the server
  # does not start with --skip-tokenizer-init yet (TokenText(None) in hybrid_sgl/server/app.py).
  python3 bench/serving.py --launch "--model-path configs/$1 --load-format dummy \
      --tokenizer-path configs/default-tiny-qwen3_5 --context-length 2048 --log-level info" \
    --launch-log "$OUT/server_$1.log" --num-prompts 256 --random-input-len 1024 --random-output-len 256 \
    --request-rate inf --warmup-requests 16 --out "$OUT/serving_$1.json" ${SERVING_ARGS:-} 2>&1 | tee "$OUT/serving_$1.txt"
  grep -E "memory plan|captured|error|Error" "$OUT/server_$1.log" | tail -5
}

part=${1:-all}
shift || true
case $part in
  offline) for c in "${@:-qwen3_5-9b-text}"; do offline "$c"; done ;;
  serving) serving "${1:-qwen3_5-9b-text}" ;;
  all) offline qwen3_5-9b-text; offline nemotron_h-8b; serving qwen3_5-9b-text ;;
  *) echo "usage: bash bench/offline_device.sh offline [CONFIG_DIR ...] | serving [CONFIG_DIR] | all" >&2; exit 2 ;;
esac
