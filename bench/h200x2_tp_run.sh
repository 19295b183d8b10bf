#!/usr/bin/env bash
# Tensor parallelism on two H200s (the nvidia-h200-x2 kind) in one call: CUDA parity of --tp-size 2
# against tp 1, decode tok/s at tp 1 and 2 in the same run, and a 256-request serving run at tp 2.
# Run from the repo root with the wheel folder carried (WHEELS, default .whl_srv; bench/device_wheels.sh
# fills it). Logs go to $OUT. On one GPU, `TP=1 bash bench/h200x2_tp_run.sh offline` runs the tp 1 half.
#   bash bench/h200x2_tp_run.sh [tests|offline|ep|profile|serving ...]   (default: all five)
. "$(dirname "$0")/device_env.sh"
TPS=${TP:-"1 2"}

for part in ${*:-tests offline ep profile serving}; do
  case $part in
    tests)
      timeout 400 python3 -m pytest -q -rf -p no:cacheprovider tests/gpu/test_tensor_parallel_cuda.py 2>&1 \
        | tee "$OUT/tests_tp_gpu.log" | tail -8 ;;
    offline)  # decode at batch 1, 32 and 128 (prompt 512, 128 out) at each tp, same run
      for c in qwen3_5-9b-text qwen3_5-35b-a3b-text qwen3_next-80b-a3b; do
        for tp in $TPS; do
          [ "$c" = qwen3_next-80b-a3b ] && [ "$tp" = 1 ] && continue  # 159 GB of bf16 weights: two GPUs only
          timeout 300 python3 bench/offline.py --config "configs/$c" --batch 1,32,128 --prompt 512 --output 128 \
            --skip-hf --engine-arg tp_size=$tp --out "$OUT/offline_tp${tp}_$c.json" 2>&1 | quiet \
            | tee "$OUT/offline_tp${tp}_$c.md" | sed -n '/## Decode$/,/## End/p'
        done
      done ;;
    ep)  # the MoE shapes at --tp-size 2 --ep-size 2 (whole experts per GPU) against their tp 2 rows above
      for c in qwen3_5-35b-a3b-text qwen3_next-80b-a3b; do
        timeout 300 python3 bench/offline.py --config "configs/$c" --batch 1,32,128 --prompt 512 --output 128 \
          --skip-hf --engine-arg tp_size=2 --engine-arg ep_size=2 --out "$OUT/offline_ep2_$c.json" 2>&1 | quiet \
          | tee "$OUT/offline_ep2_$c.md" | sed -n '/## Decode$/,/## End/p'
      done ;;
    profile)  # rank 0's decode kernels at tp 2, batch 1 and 32: the all-reduces' share of a step
      for b in 1 32; do
        timeout 200 python3 bench/decode_profile.py --config configs/qwen3_5-9b-text --batch $b --tp-size 2 --top 30 \
          2>&1 | quiet | tee "$OUT/profile_tp2_b$b.md" | grep -iE "^# |allreduce|all_reduce|nccl" | head -8
      done ;;
    serving)  # 256 concurrent random 1k-in / 256-out requests over HTTP at tp 2; pools free afterwards
      timeout 500 python3 bench/serving.py --launch "--model-path configs/qwen3_5-9b-text --load-format dummy \
          --skip-tokenizer-init --context-length 2048 --tp-size 2" --launch-log "$OUT/server_tp2.log" \
        --num-prompts 256 --random-input-len 1024 --random-output-len 256 --request-rate inf --warmup-requests 16 \
        --out "$OUT/serving_tp2.json" 2>&1 | tee "$OUT/serving_tp2.txt" | tail -30 ;;
  esac
done
