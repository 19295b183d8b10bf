#!/usr/bin/env bash
# The GPU runs of the benchmarks and the CUDA test groups, in parts of about ten minutes or less each (the
# step-graph runs have their own script, bench/h200_step_run.sh). Run from the repository root on the GPU
# machine with the wheel folder carried (WHEELS, default .whl_srv; bench/device_wheels.sh fills it), .vllm_min/
# for the attention anchor (bench/vendor_vllm_attention.sh), and for `mamba` WHEELS=.whl holding the mamba_ssm
# wheel. Logs and raw output go to $OUT (default /tmp/hybrid_sgl_bench), the commit to $OUT/commit.txt;
# ARCHIVE=1 packs $OUT into $OUT/results.tgz at the end. The tp_* parts need two GPUs.
#   bash bench/h200_run.sh PART...         e.g.  bash bench/h200_run.sh kernels fp8_9b
#   bash bench/h200_run.sh --help          lists the parts
usage() {
  sed -n '2,/^usage()/{/^#/{s/^# \{0,1\}//;p}}' "$0"
  echo "parts:"
  grep -E '^    [a-z0-9_|]+\)  # ' "$0" | sed -E 's/^    ([a-z0-9_|]+)\)  # /  \1: /'
}
case "${1:-}" in
  -h|--help) usage; exit 0 ;;
  "") usage; exit 2 ;;
esac
. "$(dirname "$0")/device_env.sh"
export PYTHONPATH=$PYTHONPATH:$PWD/.vllm_min
git rev-parse HEAD > "$OUT/commit.txt" 2>/dev/null || true  # a carried tree may hold an older .git: record it by hand too

offline() {  # offline NAME CONFIG ARGS...: bench/offline.py into $OUT/offline_NAME.{md,json}, its decode table shown
  local name=$1 config=$2; shift 2
  date +%T; timeout "${OFFLINE_TIMEOUT:-300}" python3 bench/offline.py --config "configs/$config" \
    --out "$OUT/offline_$name.json" "$@" 2>&1 | quiet | tee "$OUT/offline_$name.md" | sed -n '/## Decode$/,/## End/p' \
    | head -16
}
bf16_fp8() {  # bf16_fp8 NAME CONFIG ARGS...: offline bf16_NAME, then fp8_NAME with online FP8 (--quantization fp8)
  local name=$1; shift
  offline "bf16_$name" "$@"
  offline "fp8_$name" "$@" --engine-arg quantization=fp8
}
profile() {  # profile NAME CONFIG ARGS...: bench/decode_profile.py into $OUT/profile_NAME.md
  local name=$1 config=$2; shift 2
  date +%T; timeout 150 python3 bench/decode_profile.py --config "configs/$config" --top 30 "$@" 2>&1 | quiet \
    | tee "$OUT/profile_$name.md" | head -40
}
group() {  # group NAME SECONDS FILES...: one pytest run, each test named as it ends (-v), into $OUT/tests_NAME.log
  local name=$1 limit=$2; shift 2; date +%T
  timeout "$limit" python3 -m pytest -v -rfE -p no:cacheprovider --durations=10 "$@" > "$OUT/tests_$name.log" 2>&1
  grep -E "FAILED|ERROR|passed|failed" "$OUT/tests_$name.log" | tail -12
}
FP8_EXPERTS="--engine-arg quantization=fp8 --engine-arg enable_fp8_experts=true"
SUITE="tests/gpu tests/kernels tests/test_composed_gpu.py tests/test_fp8_checkpoint.py"

for part in "$@"; do
  case $part in
    # ---- CUDA tests ----
    suite)  # the whole CUDA suite (tests/gpu, tests/kernels, composed, FP8 checkpoints) over 4 pytest workers
      timeout "${TESTS_TIMEOUT:-580}" python3 -m pytest -q -n 4 -rfE -p no:cacheprovider --durations=15 $SUITE 2>&1 \
        | tee "$OUT/tests_suite.log" | tail -40 ;;
    tests_gpu|tests_kernels_a|tests_kernels_b)  # the same suite serially, in three calls
      case $part in
        tests_gpu) files="tests/gpu tests/test_composed_gpu.py tests/test_fp8_checkpoint.py" ;;
        tests_kernels_a) files=$(ls tests/kernels/test_[a-f]*.py) ;;
        tests_kernels_b) files=$(ls tests/kernels/test_[g-z]*.py) ;;
      esac
      timeout "${TESTS_TIMEOUT:-540}" python3 -m pytest -q -rfE -p no:cacheprovider --durations=15 $files 2>&1 \
        | tee "$OUT/$part.log" | tail -30 ;;
    tests_kernels)  # GDN, conv1d, norms, attention kernels (with the sm_90a compile checks)
      group kernels 540 tests/kernels/test_gdn_recurrent.py tests/kernels/test_gdn_chunk.py \
        tests/kernels/test_causal_conv1d.py tests/kernels/test_norms.py tests/kernels/test_gate_rmsnorm.py \
        tests/kernels/test_paged_attention.py tests/kernels/test_attention_prep.py tests/kernels/test_vllm_attention.py \
        tests/kernels/test_gdn_sm90_compile.py ;;
    tests_moe)  # routing, the fused MoE and its expert GEMVs, fastest.py, the MoE graph replays on CUDA
      group moe 540 tests/kernels/test_moe_routing.py tests/kernels/test_fused_moe.py tests/kernels/test_moe_gemv.py \
        tests/kernels/test_fastest.py tests/kernels/test_moe_sm90_compile.py tests/gpu/test_fused_moe_cuda.py ;;
    tests_fp8)  # the FP8 GEMMs, FP8 models against the CPU reference, FP8 checkpoints
      group fp8 540 tests/kernels/test_fp8_gemm.py tests/kernels/test_fp8_sm90_compile.py tests/gpu/test_fp8_cuda.py \
        tests/test_fp8_checkpoint.py ;;
    tests_sampler)  # the sampler and its kernels, the overlap schedule (no host sync in a step)
      group sampler 400 tests/gpu/test_sampler_cuda.py tests/kernels/test_sampling_kernels.py \
        tests/test_sampler_exact.py tests/test_sampler.py tests/gpu/test_overlap_cuda.py ;;
    tests_models)  # every family against HF on CUDA (torch and Triton paths, graphs), composed hybrid, dense linears
      group models 540 tests/gpu/test_model_cuda.py tests/test_composed_gpu.py tests/gpu/test_dense_linear_cuda.py ;;
    tests_mamba)  # SSD / SSM-step kernels on CUDA; the Mamba families through the Triton kernels against HF
      group mamba_kernels 120 tests/gpu/test_ssd_chunk_cuda.py tests/gpu/test_ssm_step_cuda.py
      group mamba_models 240 tests/gpu/test_model_cuda.py -k "(bamba or granite or nemotron or falcon or jamba) and not torch" ;;
    tests_prefix)  # the prefix cache on CUDA: every family, cache on = cache off, cached tokens as designed
      group prefix_cache 300 tests/gpu/test_prefix_cache_cuda.py ;;
    tests_tp)  # two GPUs: --tp-size 2 against tp 1 on CUDA
      group tp 400 tests/gpu/test_tensor_parallel_cuda.py ;;

    # ---- kernels against their anchors ----
    kernels)  # GDN and conv1d against fla-core; paged attention against vLLM and SDPA
      timeout 300 python3 bench/gdn_kernels.py 2>&1 | tee "$OUT/gdn_kernels.md" | tail -30
      timeout 300 python3 bench/attention_kernels.py 2>&1 | tee "$OUT/attention_kernels.md" | tail -40 ;;
    mamba)  # Mamba2 SSD prefill and SSM steps against mamba_ssm's Triton kernels (WHEELS=.whl)
      timeout 120 python3 bench/ssd_bench.py 2>&1 | tee "$OUT/ssd_bench.md" | tail -25
      timeout 60 python3 bench/ssm_step_bench.py --no-tune 2>&1 | tee "$OUT/ssm_step_bench.md" | tail -20 ;;
    moe)  # the fused MoE at the 35B-A3B and 80B-A3B expert shapes, every T, tuning and profile sections
      timeout 300 python3 bench/moe_kernels.py 2>&1 | tee "$OUT/moe_kernels.md" | grep -E "^\||copy|Error" | head -60 ;;
    moe_few)  # the fused MoE at 35B-A3B, T 1-16, bf16 and FP8 experts, both few-token paths, no tuning
      for fp8 in "" --fp8; do
        timeout 150 python3 bench/moe_kernels.py --no-tune --no-profile --models 35B $fp8 --tokens 1 2 4 8 16 2>&1 \
          | tee "$OUT/moe_35b${fp8:+_fp8}.md" | grep -E "^\||copy|Error"
      done ;;
    moe_batch)  # the fused MoE at 35B-A3B, T 16-128 (decode batches past the expert GEMVs), bf16 and FP8 experts, split by kernel
      for fp8 in "" --fp8; do
        timeout 130 python3 bench/moe_kernels.py --no-tune --models 35B $fp8 --tokens 16 32 64 128 2>&1 \
          | tee "$OUT/moe_batch_35b${fp8:+_fp8}.md" | grep -E "^\||copy|Error"
      done ;;
    fp8_35b_b32)  # 35B-A3B cut to its first 20 layers (bf16 fits one H100), batch 1 / 32: bf16, FP8 linears, FP8 linears and experts; kernels at batch 32
      cut_35b
      offline bf16_35b20 tmp_35b_20l --batch 1,32 --prompt 512 --output 64 --skip-hf
      offline fp8_35b20 tmp_35b_20l --batch 1,32 --prompt 512 --output 64 --skip-hf --engine-arg quantization=fp8
      offline fp8e_35b20 tmp_35b_20l --batch 1,32 --prompt 512 --output 64 --skip-hf $FP8_EXPERTS
      profile 35b20_b32_bf16 tmp_35b_20l --batch 32 --graphs
      profile 35b20_b32_fp8 tmp_35b_20l --batch 32 --graphs --engine-arg quantization=fp8 ;;
    fp8_sweep)  # FP8 against bf16 at batch 1-128: the 9B (dense) and 35B-A3B cut to 20 layers (FP8 linears; FP8 linears and experts)
      cut_35b
      sweep="--batch 1,8,32,64,128 --prompt 256 --output 32 --skip-hf"
      offline sweep_bf16_9b qwen3_5-9b-text $sweep
      offline sweep_fp8_9b qwen3_5-9b-text $sweep --engine-arg quantization=fp8
      offline sweep_bf16_35b20 tmp_35b_20l $sweep
      offline sweep_fp8_35b20 tmp_35b_20l $sweep --engine-arg quantization=fp8
      offline sweep_fp8e_35b20 tmp_35b_20l $sweep $FP8_EXPERTS ;;
    fp8_b64)  # the FP8 decode GEMMs at 32 / 64 rows (weight-only, W8A8, the path served), then 9B bf16 against FP8 at batch 32-128
      timeout 150 python3 bench/fp8_kernels.py --tokens 32 64 2>&1 | tee "$OUT/fp8_kernels_b64.md" | grep -E "^\||chose|Error"
      sweep="--batch 32,64,128 --prompt 256 --output 32 --skip-hf"
      offline b64_bf16_9b qwen3_5-9b-text $sweep
      offline b64_fp8_9b qwen3_5-9b-text $sweep --engine-arg quantization=fp8 ;;
    engine_cycle)  # two 9B engines in a row: device memory after shutdown, first-request TTFT of each prompt size
      timeout 300 python3 bench/engine_cycle.py --config configs/qwen3_5-9b-text --out "$OUT/engine_cycle_9b.json" 2>&1 \
        | quiet | tee "$OUT/engine_cycle_9b.log" | tail -14 ;;
    moe_tune)  # the fused MoE's launch configs at 35B-A3B, T 1 and 8, bf16 and FP8
      for fp8 in "" --fp8; do
        timeout 200 python3 bench/moe_kernels.py --no-profile --models 35B $fp8 --tokens 1 8 2>&1 \
          | tee "$OUT/moe_tune${fp8:+_fp8}.md" | grep -E "^\||tuning|^  [0-9]" | head -60
      done ;;
    fp8kernels)  # the FP8 GEMMs against bf16 cuBLAS on the 9B linear shapes, decode- and prefill-sized M
      timeout 200 python3 bench/fp8_kernels.py 2>&1 | tee "$OUT/fp8_kernels.md" | grep -E "^\||copy|Error" ;;
    sampler)  # one sampling step at the 9B vocabulary: the served draw against the torch path and greedy
      timeout 120 python3 bench/sampler_kernels.py 2>&1 | tee "$OUT/sampler_kernels.md" | grep -E "^\||copy|Error"
      for scale in 4 0.5; do  # peaked and flat rows
        timeout 60 python3 bench/sampler_kernels.py --scale $scale --batch 1 64 2>&1 \
          | tee "$OUT/sampler_kernels_scale$scale.md" | grep -E "^\||copy|Error"
      done ;;

    # ---- end to end (bench/offline.py, dummy weights) ----
    offline)  # 9B and Nemotron-H-8B decode and prefill (OFFLINE_ARGS, default batch 1 / 32, prompt 512, 128 out)
      for c in qwen3_5-9b-text nemotron_h-8b; do
        offline "$c" "$c" ${OFFLINE_ARGS:---batch 1,32 --prompt 512 --output 128 --skip-hf}
      done ;;
    anchor)  # 9B decode against HF generate in one run, batch 1 / 32, 256 out
      offline anchor_9b qwen3_5-9b-text --batch 1,32 --prompt 512 --output 256 ;;
    prefill)  # the 9B 8192-token prefill against HF generate
      offline prefill_9b qwen3_5-9b-text --batch 1 --prompt 8192 --output 16 --hf-batches 1 ;;
    no_overlap)  # 9B and Nemotron-H-8B with the overlap scheduler off
      for c in qwen3_5-9b-text nemotron_h-8b; do
        offline "no_overlap_$c" "$c" --batch 1,32 --prompt 512 --output 128 --skip-hf \
          --engine-arg disable_overlap_schedule=true
      done ;;
    moe_e2e)  # 35B-A3B, Qwen3-Next-80B-A3B (24 of 48 layers) and Granite-4.0-H-Small at batch 1 / 32
      for c in qwen3_5-35b-a3b-text qwen3_next-80b-a3b-24l granite_4_0-h-small; do
        offline "$c" "$c" --batch 1,32 --prompt 512 --output 128 --skip-hf
      done ;;
    composed)  # the composed 8B hybrid (configs/hybrid-sgl-8b) under decode CUDA graphs
      offline composed_8b hybrid-sgl-8b --batch 1,32 --prompt 512 --output 128 --skip-hf ;;
    fp8_9b)  # 9B bf16 against --quantization fp8: batch-1 decode (prompt 1024) and the 8192-token prefill
      bf16_fp8 9b_b1 qwen3_5-9b-text --batch 1 --prompt 1024 --output 128 --skip-hf
      bf16_fp8 9b_8k qwen3_5-9b-text --batch 1 --prompt 8192 --output 16 --skip-hf ;;
    fp8)  # 9B bf16 against FP8 at batch 1 / 32 after an 8192-token prompt
      bf16_fp8 9b qwen3_5-9b-text --batch 1,32 --prompt 8192 --output 64 --skip-hf ;;
    fp8_35b)  # 35B-A3B bf16 against FP8 linears and experts, batch 1 / 32
      offline bf16_35b qwen3_5-35b-a3b-text --batch 1,32 --prompt 512 --output 128 --skip-hf
      offline fp8_35b qwen3_5-35b-a3b-text --batch 1,32 --prompt 512 --output 128 --skip-hf $FP8_EXPERTS ;;
    sampling)  # 9B greedy against temperature 0.7, + top_p 0.9 + top_k 50, and top_p 0.9 alone, batch 1 / 32 / 64
      s9="qwen3_5-9b-text --batch 1,32,64 --prompt 1024 --output 128 --skip-hf"
      offline greedy_9b $s9
      offline t07_9b $s9 --sampling temperature=0.7
      offline t07p09k50_9b $s9 --sampling temperature=0.7 --sampling top_p=0.9 --sampling top_k=50
      offline t07p09_9b $s9 --sampling temperature=0.7 --sampling top_p=0.9 ;;
    before)  # HEAD against .before/ (an older tree, carried), interleaved twice; BEFORE_CONFIG, BEFORE_ARGS
      cfg=${BEFORE_CONFIG:-qwen3_5-9b-text}
      args=${BEFORE_ARGS:---batch 1,32 --prompt 512 --output 128}
      for i in 1 2; do
        offline "head_$i" "$cfg" --skip-hf $args
        date +%T; timeout 300 python3 .before/bench/offline.py --config "configs/$cfg" --skip-hf $args \
          --out "$OUT/offline_before_$i.json" 2>&1 | quiet | tee "$OUT/offline_before_$i.md" \
          | sed -n '/## Decode$/,/## End/p' | head -16
      done ;;
    structured)  # a 10-field JSON schema at batch 32 against the same batch unconstrained, overlap on and off
      for ov in false true; do
        timeout 200 python3 bench/structured.py --batch 32 --output 128 --engine-arg disable_overlap_schedule=$ov 2>&1 \
          | quiet | tee "$OUT/structured_overlap_off_$ov.log" | tail -12
      done ;;
    serving)  # 256 concurrent requests over HTTP (9B shape, 1k in / 256 out): TTFT, TPOT, plan against peaks
      timeout 400 python3 bench/serving.py --launch "--model-path configs/qwen3_5-9b-text --load-format dummy \
          --tokenizer-path configs/default-tiny-qwen3_5 --context-length 2048 --log-level info" \
        --launch-log "$OUT/server.log" --num-prompts 256 --random-input-len 1024 --random-output-len 256 \
        --request-rate inf --warmup-requests 16 --out "$OUT/serving.json" ${SERVING_ARGS:-} 2>&1 | tee "$OUT/serving.txt"
      grep -E "memory plan|decode GEMMs|captured|rror" "$OUT/server.log" | tail -8 ;;

    # ---- where the time goes (bench/decode_profile.py) ----
    profile)  # per-kernel decode profile; PROFILE_CONFIGS (9B, Nemotron-H), PROFILE_BATCH (1), PROFILE_ARGS
      for c in ${PROFILE_CONFIGS:-qwen3_5-9b-text nemotron_h-8b}; do
        profile "b${PROFILE_BATCH:-1}_$c" "$c" --batch "${PROFILE_BATCH:-1}" ${PROFILE_ARGS:-}
      done ;;
    profiles)  # batch-1 decode profiles under CUDA graphs: 9B and 35B-A3B, bf16 and FP8
      profile 9b_b1_bf16 qwen3_5-9b-text --batch 1 --graphs
      profile 35b-a3b_b1_bf16 qwen3_5-35b-a3b-text --batch 1 --graphs
      profile 9b_b1_fp8 qwen3_5-9b-text --batch 1 --graphs --engine-arg quantization=fp8
      profile 35b-a3b_b1_fp8 qwen3_5-35b-a3b-text --batch 1 --graphs $FP8_EXPERTS ;;
    profile_sampling)  # 9B batch-64 decode profile, greedy against temperature 0.7 + top_p 0.9 + top_k 50
      profile 9b_b64_greedy qwen3_5-9b-text --batch 64 --graphs
      profile 9b_b64_sampled qwen3_5-9b-text --batch 64 --graphs --sampling temperature=0.7 --sampling top_p=0.9 \
        --sampling top_k=50 ;;

    # ---- prefix cache (bench/prefix_cache.py, the cache on and off in one run) ----
    prefix)  # 9B: hit TTFT, n = 8, shared system prompts + long suffixes, unrelated prompts
      timeout 300 python3 bench/prefix_cache.py offline --config configs/qwen3_5-9b-text \
        --shared-requests "${SHARED_REQUESTS:-500}" --out "$OUT/prefix_cache_qwen3_5-9b.json" 2>&1 | quiet \
        | tee "$OUT/prefix_cache_qwen3_5-9b.log" | grep -E "memory plan|ratio|rror" ;;
    prefix_mamba)  # Nemotron-H-8B (Mamba2): hit TTFT and n = 8
      timeout 240 python3 bench/prefix_cache.py offline --config configs/nemotron_h-8b --cases ttft,n8 \
        --out "$OUT/prefix_cache_nemotron_h-8b.json" 2>&1 | quiet | tee "$OUT/prefix_cache_nemotron_h-8b.log" \
        | grep -E "memory plan|rror" ;;
    multiturn)  # 64 users x 8 turns over HTTP against --disable-radix-cache
      timeout 280 python3 bench/prefix_cache.py multiturn --config configs/qwen3_5-9b-text \
        --out "$OUT/multiturn_qwen3_5-9b.json" 2>&1 | quiet | tee "$OUT/multiturn_qwen3_5-9b.log" | tail -4 ;;

    # ---- tensor parallelism, two GPUs (TP=1 runs the tp 1 half on one) ----
    tp_offline)  # decode at batch 1 / 32 / 128 at tp 1 and 2 (9B, 35B-A3B; 80B-A3B at tp 2 only)
      for c in qwen3_5-9b-text qwen3_5-35b-a3b-text qwen3_next-80b-a3b; do
        for tp in ${TP:-1 2}; do
          [ "$c" = qwen3_next-80b-a3b ] && [ "$tp" = 1 ] && continue  # 159 GB of bf16 weights: two GPUs only
          offline "tp${tp}_$c" "$c" --batch 1,32,128 --prompt 512 --output 128 --skip-hf --engine-arg tp_size=$tp
        done
      done ;;
    tp_ep)  # the MoE shapes at --tp-size 2 --ep-size 2 (whole experts per GPU)
      for c in qwen3_5-35b-a3b-text qwen3_next-80b-a3b; do
        offline "ep2_$c" "$c" --batch 1,32,128 --prompt 512 --output 128 --skip-hf --engine-arg tp_size=2 \
          --engine-arg ep_size=2
      done ;;
    tp_profile)  # rank 0's decode kernels at tp 2, batch 1 and 32: the all-reduces' share of a step
      for b in 1 32; do
        profile "tp2_b$b" qwen3_5-9b-text --batch $b --tp-size 2 | grep -iE "^# |allreduce|all_reduce|nccl" | head -8
      done ;;
    tp_serving)  # 256 concurrent requests over HTTP at tp 2; pools free afterwards
      timeout 500 python3 bench/serving.py --launch "--model-path configs/qwen3_5-9b-text --load-format dummy \
          --skip-tokenizer-init --context-length 2048 --tp-size 2" --launch-log "$OUT/server_tp2.log" \
        --num-prompts 256 --random-input-len 1024 --random-output-len 256 --request-rate inf --warmup-requests 16 \
        --out "$OUT/serving_tp2.json" 2>&1 | tee "$OUT/serving_tp2.txt" | tail -30 ;;
    *) echo "unknown part: $part (bash bench/h200_run.sh --help lists them)" >&2 ;;
  esac
done
if [ -n "${ARCHIVE:-}" ]; then
  (cd "$OUT" && tar czf /tmp/results.tgz . && find . -mindepth 1 -delete && mv /tmp/results.tgz results.tgz)
fi
