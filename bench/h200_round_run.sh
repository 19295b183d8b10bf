#!/usr/bin/env bash
# The GPU pass of the structured-output, scale-out, FP8/sampling and composed-hybrid work on one H200,
# in parts that fit a call each. Run from the repo root with the wheel folder carried (WHEELS, default
# .whl_srv; bench/device_wheels.sh fills it). Logs go to $OUT.
#   bash bench/h200_round_run.sh [score1|score2|score3|profiles|race_i|final_i|j1|suite|i3|i2|next_h|g1|g2|fault_f|last_e|final_e|verify_e|gdnnorm|verify_d|fuse|head|fp8gemv|moe6|probe|moe5|moe4|day7|day6|day5|day2a|day2b|day2c|tests|tests_gpu|tests_kernels_a|tests_kernels_b|kernels_left|e2e35b1|final35|verify|final|structured|composed|sampling|fp8|fp8tests|fp8quick|fp8decode|fp8check|fp8moe|fp8kernels|moe|moe2|moe3|e2e35|profile35|tp1 ...]
. "$(dirname "$0")/device_env.sh"
offline() {  # offline NAME CONFIG ARGS...: decode table of bench/offline.py into $OUT/offline_NAME.{md,json}
  local name=$1 config=$2; shift 2
  timeout 300 python3 bench/offline.py --config "configs/$config" --skip-hf --out "$OUT/offline_$name.json" "$@" \
    2>&1 | quiet | tee "$OUT/offline_$name.md" | sed -n '/## Decode$/,/## End/p' | head -12
}
bf16_fp8() {  # bf16_fp8 NAME CONFIG ARGS...: offline bf16_NAME, then fp8_NAME with online FP8 (--quantization fp8)
  local name=$1; shift
  offline "bf16_$name" "$@"
  offline "fp8_$name" "$@" --engine-arg quantization=fp8
}
profile() {  # profile NAME CONFIG ARGS...: batch-1 decode profile under CUDA graphs into $OUT/profile_NAME.md
  local name=$1 config=$2; shift 2
  date +%T; timeout 150 python3 bench/decode_profile.py --config "configs/$config" --batch 1 --graphs --top 30 "$@" \
    2>&1 | quiet | tee "$OUT/profile_$name.md" | sed -n 3,16p
}
ab() {  # ab NAME CONFIG ARGS...: bench/offline.py at HEAD, then the same from .before/ (an older tree, carried)
  date +%T; offline "$@"
  local name=$1 config=$2; shift 2
  timeout 150 python3 .before/bench/offline.py --config "configs/$config" --skip-hf \
    --out "$OUT/offline_before_$name.json" "$@" 2>&1 | quiet | tee "$OUT/offline_before_$name.md" \
    | sed -n '/## Decode$/,/## End/p' | head -6
}
group() {  # group NAME SECONDS FILES...: one pytest run, each test named as it ends (-v), into $OUT/tests_NAME.log
  local name=$1 limit=$2; shift 2; date +%T
  timeout "$limit" python3 -m pytest -v -rfE -p no:cacheprovider --durations=10 "$@" 2>&1 \
    > "$OUT/tests_$name.log"; grep -E "FAILED|ERROR|passed|failed" "$OUT/tests_$name.log" | tail -12
}
for part in ${*:-tests}; do
  case $part in
    tests)  # every CUDA test: kernels, model parity, graphs, overlap, prefix cache, TP at 1 GPU, composed
      timeout ${TESTS_TIMEOUT:-400} python3 -m pytest -q -rfE -p no:cacheprovider --durations=15 tests/gpu tests/kernels \
        tests/test_composed_gpu.py tests/test_fp8_checkpoint.py 2>&1 | tee "$OUT/tests_gpu.log" | tail -40 ;;
    tests_gpu|tests_kernels_a|tests_kernels_b)  # the whole CUDA suite in three calls of at most 540 s each
      case $part in
        tests_gpu) files="tests/gpu tests/test_composed_gpu.py tests/test_fp8_checkpoint.py" ;;
        tests_kernels_a) files=$(ls tests/kernels/test_[a-f]*.py) ;;
        tests_kernels_b) files=$(ls tests/kernels/test_[g-z]*.py) ;;
      esac
      timeout ${TESTS_TIMEOUT:-540} python3 -m pytest -q -rfE -p no:cacheprovider --durations=15 $files 2>&1 \
        | tee "$OUT/$part.log" | tail -30 ;;
    structured)  # 10-field JSON schema at batch 32 against the same batch free, overlap on and off
      for ov in false true; do
        timeout 200 python3 bench/structured.py --batch 32 --output 128 \
          --engine-arg disable_overlap_schedule=$ov 2>&1 | quiet | tee "$OUT/structured_overlap_off_$ov.log" | tail -12
      done ;;
    composed)  # the 8B composed hybrid under decode CUDA graphs against its roofline
      offline composed_8b hybrid-sgl-8b --batch 1,32 --prompt 512 --output 128 ;;
    sampling)  # 9B decode greedy vs temperature 0.7 (+ top_p 0.9), batch 1 / 32 / 64, same run
      offline greedy_9b qwen3_5-9b-text --batch 1,32,64 --prompt 1024 --output 128
      offline t07_9b qwen3_5-9b-text --batch 1,32,64 --prompt 1024 --output 128 --sampling temperature=0.7
      offline t07p09_9b qwen3_5-9b-text --batch 1,32,64 --prompt 1024 --output 128 --sampling temperature=0.7 \
        --sampling top_p=0.9 --sampling top_k=50 ;;
    fp8)  # 9B bf16 vs online FP8: batch-1 decode and an 8192-token prefill, same run
      bf16_fp8 9b qwen3_5-9b-text --batch 1,32 --prompt 8192 --output 64 ;;
    verify)  # the FP8 GEMM, the small-T MoE path and the combine on CUDA, and the families through them
      timeout 300 python3 -m pytest -q -rfE -p no:cacheprovider tests/kernels/test_fp8_gemm.py \
        tests/kernels/test_fused_moe.py tests/gpu/test_fused_moe_cuda.py tests/gpu/test_fp8_cuda.py \
        tests/gpu/test_model_cuda.py -k "not torch" 2>&1 | tee "$OUT/tests_verify.log" | tail -25 ;;
    moe)  # fused MoE kernels at the 35B-A3B shape, its decode, and where a batch-1 step's time goes
      timeout 200 python3 bench/moe_kernels.py --no-tune --tokens 1 2 4 8 16 64 2>&1 | tee "$OUT/moe_kernels.md" \
        | grep "^|"
      offline bf16_35b qwen3_5-35b-a3b-text --batch 1,32 --prompt 512 --output 128
      timeout 150 python3 bench/decode_profile.py --config configs/qwen3_5-35b-a3b-text --batch 1 --graphs --top 25 \
        2>&1 | quiet | tee "$OUT/profile_35b_b1.md" | tail -32 ;;
    final)  # the last pass: the changed kernels' tests, MoE at small T, FP8 kernels, 35B and 9B FP8 decode
      timeout 200 python3 -m pytest -q -rfE -p no:cacheprovider tests/kernels/test_fp8_gemm.py \
        tests/kernels/test_fused_moe.py tests/gpu/test_fused_moe_cuda.py tests/gpu/test_fp8_cuda.py \
        tests/gpu/test_model_cuda.py -k "not torch and not bfloat16 and (moe or next or granite or jamba or nemotron \
        or fp8 or fused or Fp8 or combine or reference or block or quantize or activation or tokens or skewed \
        or routing or relu or silu or tight or graph or real)" 2>&1 | tee "$OUT/tests_final.log" | tail -12
      timeout 100 python3 bench/moe_kernels.py --no-tune --no-profile --tokens 1 2 4 8 2>&1 \
        | tee "$OUT/moe_kernels_final.md" | grep "^|"
      timeout 150 python3 bench/fp8_kernels.py 2>&1 | tee "$OUT/fp8_kernels.md" | grep -E "^\||copy"
      offline bf16_35b_final qwen3_5-35b-a3b-text --batch 1 --prompt 512 --output 128
      bf16_fp8 9b_final qwen3_5-9b-text --batch 1,32 --prompt 8192 --output 64 ;;
    fp8tests)  # the FP8 kernels and the FP8 checkpoints on CUDA, and where the bf16 combine parts from eager
      timeout 300 python3 -m pytest -q -rfE -p no:cacheprovider tests/kernels/test_fp8_gemm.py tests/gpu/test_fp8_cuda.py \
        2>&1 | tee "$OUT/tests_fp8.log" | tail -12
      timeout 60 python3 bench/combine_probe.py 2>&1 | tee "$OUT/combine_probe.log" ;;
    fp8quick)  # the FP8 kernel tests, the combine probe and the kernel table only
      timeout 200 python3 -m pytest -q -rfE -p no:cacheprovider tests/kernels/test_fp8_gemm.py 2>&1 \
        | tee "$OUT/tests_fp8_kernels.log" | tail -8
      timeout 60 python3 bench/combine_probe.py 2>&1 | tee "$OUT/combine_probe.log"
      timeout 200 python3 bench/fp8_kernels.py 2>&1 | tee "$OUT/fp8_kernels.md" | grep -E "^\||copy|quantization" ;;
    fp8decode)  # every decode-sized FP8 GEMM variant, as CUDA-graph replays
      timeout 200 python3 bench/fp8_decode_variants.py 2>&1 | tee "$OUT/fp8_decode_variants.md" | grep -E "^\||copy|Error" ;;
    fp8check)  # the FP8 kernels' and the combine's CUDA tests
      timeout 300 python3 -m pytest -q -rfE -p no:cacheprovider tests/kernels/test_fp8_gemm.py \
        tests/kernels/test_fused_moe.py::test_bf16_combine_rounds_where_eager_rounds 2>&1 \
        | tee "$OUT/tests_fp8_combine.log" | tail -8 ;;
    fp8moe)  # --enable-fp8-experts: its CUDA test, then 35B-A3B bf16 vs FP8 (experts too) at batch 1 / 32
      timeout 200 python3 -m pytest -q -rfE -p no:cacheprovider tests/gpu/test_fp8_cuda.py \
        tests/kernels/test_fused_moe.py -k fp8_experts 2>&1 | tee "$OUT/tests_fp8_moe.log" | tail -8
      offline bf16_35b qwen3_5-35b-a3b-text --batch 1,32 --prompt 512 --output 128
      offline fp8_35b qwen3_5-35b-a3b-text --batch 1,32 --prompt 512 --output 128 --engine-arg quantization=fp8 \
        --engine-arg enable_fp8_experts=true ;;
    moe2)  # stacked shared expert, router kernel, down kernel summing the slots, 16-bit decode linears
      timeout 240 python3 -m pytest -q -rfE -p no:cacheprovider tests/kernels/test_moe_routing.py \
        tests/kernels/test_fused_moe.py tests/kernels/test_fp8_gemm.py tests/gpu/test_fused_moe_cuda.py \
        tests/gpu/test_dense_linear_cuda.py tests/gpu/test_fp8_cuda.py 2>&1 | tee "$OUT/tests_moe2.log" | tail -12
      timeout 100 python3 bench/decode_linears.py 2>&1 | tee "$OUT/decode_linears.md" | grep -E "^\||copy|Error"
      for fp8 in "" --fp8; do
        timeout 100 python3 bench/moe_kernels.py --no-tune --no-profile $fp8 --tokens 1 2 4 8 16 2>&1 \
          | tee "$OUT/moe_kernels$fp8.md" | grep -E "^\||Error"
      done
      offline bf16_35b qwen3_5-35b-a3b-text --batch 1,32 --prompt 512 --output 128
      offline fp8_35b qwen3_5-35b-a3b-text --batch 1,32 --prompt 512 --output 128 --engine-arg quantization=fp8 \
        --engine-arg enable_fp8_experts=true
      offline bf16_9b qwen3_5-9b-text --batch 1,32 --prompt 512 --output 128 ;;
    moe3)  # the CUDA tests of the new MoE and linear paths (slowest listed), MoE launch configs at T 1 / 8,
      # the fp16-operand variants of the FP8 decode GEMM
      timeout 150 python3 -m pytest -q -rfE -p no:cacheprovider --durations=12 tests/kernels/test_moe_routing.py \
        tests/kernels/test_fused_moe.py tests/gpu/test_dense_linear_cuda.py 2>&1 | tee "$OUT/tests_moe3.log" | tail -20
      for fp8 in "" --fp8; do
        timeout 200 python3 bench/moe_kernels.py --no-profile --models 35B $fp8 --tokens 1 8 2>&1 \
          | tee "$OUT/moe_tune$fp8.md" | grep -E "^\||tuning|^  [0-9]" | head -60
      done
      timeout 200 python3 bench/fp8_decode_variants.py 2>&1 | tee "$OUT/fp8_decode_variants.md" | grep -E "^\||copy|Error" ;;
    day2a)  # where sampled decode spends its time (9B, batch 64), the CUDA tests of the top-k / router changes,
      # the router's launch configs
      for sampling in "" "--sampling temperature=0.7 --sampling top_p=0.9 --sampling top_k=50"; do
        timeout 120 python3 bench/decode_profile.py --batch 64 --graphs --top 25 $sampling 2>&1 | quiet \
          | tee -a "$OUT/profile_9b_b64_sampling.md" | tail -30
      done
      timeout 240 python3 -m pytest -q -rfE -p no:cacheprovider --durations=8 tests/kernels/test_moe_routing.py \
        tests/gpu/test_fused_moe_cuda.py tests/kernels/test_fused_moe.py 2>&1 | tee "$OUT/tests_changed.log" | tail -12
      left=$((560 - SECONDS)); [ $left -gt 30 ] && timeout $left python3 bench/route_kernel.py --tokens 1 8 2>&1 \
        | tee "$OUT/route_kernel.md" | grep -E "^\||copy" ;;
    day2b)  # the fused MoE's configs (35B, T 1 and 8), the PDL chain, the FP8 experts
      timeout 160 python3 bench/moe_kernels.py --no-profile --models 35B --tokens 1 8 2>&1 | tee "$OUT/moe_tune.md" \
        | grep -E "^\||tuning|^  [0-9]" | head -40
      timeout 100 python3 bench/pdl_chain.py 2>&1 | tee "$OUT/pdl_chain.md" | grep -E "^\||copy"
      left=$((540 - SECONDS)); [ $left -gt 30 ] && timeout $left python3 bench/moe_kernels.py --no-profile --no-tune \
        --models 35B --fp8 --tokens 1 8 2>&1 | tee "$OUT/moe_fp8.md" | grep -E "^\||Error" | head -40 ;;
    day2c)  # the Triton sampling draw: its CUDA tests, the sampler bench, then 9B decode greedy against sampled
      # (temperature 0.7 + top_p 0.9 + top_k 50; with TOP_P_ONLY=1 also top_p 0.9 alone) at batch 1 / 32 / 64
      timeout 200 python3 -m pytest -q -rfE -p no:cacheprovider --durations=8 tests/gpu/test_sampler_cuda.py \
        tests/kernels/test_sampling_kernels.py tests/kernels/test_moe_routing.py tests/test_sampler_exact.py \
        tests/test_sampler.py 2>&1 | tee "$OUT/tests_sampler.log" | tail -12
      timeout 120 python3 bench/sampler_kernels.py 2>&1 | tee "$OUT/sampler_kernels.md" | grep -E "^\||copy|Error"
      offline greedy_9b qwen3_5-9b-text --batch 1,32,64 --prompt 1024 --output 128
      offline t07p09k50_9b qwen3_5-9b-text --batch 1,32,64 --prompt 1024 --output 128 --sampling temperature=0.7 \
        --sampling top_p=0.9 --sampling top_k=50
      [ -n "${TOP_P_ONLY:-}" ] && offline t07p09_9b qwen3_5-9b-text --batch 1,32,64 --prompt 1024 --output 128 \
        --sampling temperature=0.7 --sampling top_p=0.9 ;;
    day5)  # the served sampler (group candidates from 32 rows, top_p rows past the candidates searched on the
      # device) and the page tables written without blocking: CUDA tests, the sampler bench (peaked and flat rows),
      # then 9B greedy against temperature 0.7 alone, + top_p 0.9 + top_k 50, and top_p 0.9 alone, batch 1 / 32 / 64
      timeout 240 python3 -m pytest -q -rfE -p no:cacheprovider --durations=5 tests/gpu/test_sampler_cuda.py \
        tests/kernels/test_sampling_kernels.py tests/gpu/test_overlap_cuda.py tests/gpu/test_prefix_cache_cuda.py \
        2>&1 | tee "$OUT/tests_sampler.log" | tail -12
      timeout 120 python3 bench/sampler_kernels.py 2>&1 | tee "$OUT/sampler_kernels.md" | grep -E "^\||copy|Error"
      timeout 60 python3 bench/sampler_kernels.py --scale 0.5 --batch 1 64 2>&1 | tee "$OUT/sampler_kernels_flat.md" \
        | grep -E "^\||copy|Error"
      offline greedy_9b qwen3_5-9b-text --batch 1,32,64 --prompt 1024 --output 128
      offline t07_9b qwen3_5-9b-text --batch 1,32,64 --prompt 1024 --output 128 --sampling temperature=0.7
      pk="--sampling temperature=0.7 --sampling top_p=0.9"
      offline t07p09k50_9b qwen3_5-9b-text --batch 1,32,64 --prompt 1024 --output 128 $pk --sampling top_k=50
      offline t07p09_9b qwen3_5-9b-text --batch 1,32,64 --prompt 1024 --output 128 $pk ;;
    day6)  # fewer candidates before a top_p row is searched, the radix search's cheaper weights: the sampler bench
      # at batch 1 / 64 (peaked N(0, 4²) and flat rows), then the sampling kernels' and the sampler's CUDA tests
      timeout 45 python3 bench/sampler_kernels.py --scale 4 --batch 1 64 2>&1 | tee "$OUT/sampler_kernels.md" \
        | grep -E "^\||copy|Error"
      timeout 45 python3 bench/sampler_kernels.py --scale 0.5 --batch 1 64 2>&1 | tee "$OUT/sampler_kernels_flat.md" \
        | grep -E "^\||copy|Error"
      timeout 60 python3 -m pytest -q -rfE -p no:cacheprovider tests/kernels/test_sampling_kernels.py \
        tests/gpu/test_sampler_cuda.py -k "top_p_bound or served or frequencies" 2>&1 | tee "$OUT/tests_sampler.log" \
        | tail -4 ;;
    day7)  # the sampler at HEAD (128 candidates before a top_p row is searched): every sampler and sampling-kernel
      # CUDA test, then 9B greedy against top_p 0.9 + top_k 50 and top_p 0.9 alone, batch 1 / 32 / 64
      timeout 200 python3 -m pytest -q -rfE -p no:cacheprovider --durations=5 tests/gpu/test_sampler_cuda.py \
        tests/kernels/test_sampling_kernels.py tests/gpu/test_overlap_cuda.py 2>&1 | tee "$OUT/tests_sampler.log" \
        | tail -8
      offline greedy_9b qwen3_5-9b-text --batch 1,32,64 --prompt 1024 --output 128
      pk="--sampling temperature=0.7 --sampling top_p=0.9"
      offline t07p09k50_9b qwen3_5-9b-text --batch 1,32,64 --prompt 1024 --output 128 $pk --sampling top_k=50
      offline t07p09_9b qwen3_5-9b-text --batch 1,32,64 --prompt 1024 --output 128 $pk ;;
    gdnnorm)  # the GDN decode step with its output norm each way it can run (bench ran in verify_e; two launches, the
      # served whole-head kernel, 8 warps, the head's last program normalizing), then its kernel tests on CUDA
      timeout 120 python3 bench/gdn_decode_norm.py 2>&1 | tee "$OUT/gdn_decode_norm.md" | grep -E "^\||Error"
      timeout 120 python3 -m pytest -q -rfE -p no:cacheprovider tests/kernels/test_gdn_recurrent.py 2>&1 \
        | tee "$OUT/tests_gdn.log" | tail -4 ;;
    score1)  # the fused GDN norm's bf16 test at its derived tolerance; then issue 16's decode rows at one commit: 9B
      # and 35B-A3B batch 1, bf16 against FP8 (experts too on 35B). (It also ran the decode-graph wait test, since
      # removed: it passed with the wait removed, 2026-12-03)
      group gdn_norm 90 tests/kernels/test_gdn_recurrent.py -k "gated_norm_bf16"
      bf16_fp8 9b_b1 qwen3_5-9b-text --batch 1 --prompt 1024 --output 128
      offline bf16_35b_b1 qwen3_5-35b-a3b-text --batch 1 --prompt 512 --output 128
      offline fp8_35b_b1 qwen3_5-35b-a3b-text --batch 1 --prompt 512 --output 128 --engine-arg quantization=fp8 \
        --engine-arg enable_fp8_experts=true
      date +%T ;;
    score2)  # the rest of issue 16's table at one commit: the fused MoE at T 1 and 8 (bf16, FP8), 9B greedy against
      # temperature 0.7 at batch 1 / 32 / 64, 9B prefill of 8192 tokens bf16 against FP8; first, whether a new
      # stream waits for the caller's queued work (graph_wait_probe.py)
      timeout 30 python3 bench/graph_wait_probe.py 2>&1 | tee "$OUT/graph_wait_probe.log"
      for fp8 in "" --fp8; do
        timeout 120 python3 bench/moe_kernels.py --no-tune --no-profile --models 35B $fp8 --tokens 1 8 2>&1 \
          | tee "$OUT/moe_35b${fp8:+_fp8}.md" | grep -E "^\||copy|Error"
      done
      offline greedy_9b qwen3_5-9b-text --batch 1,32,64 --prompt 1024 --output 128
      offline t07_9b qwen3_5-9b-text --batch 1,32,64 --prompt 1024 --output 128 --sampling temperature=0.7
      bf16_fp8 9b_8k qwen3_5-9b-text --batch 1 --prompt 8192 --output 16
      date +%T ;;
    score3)  # issue 16's 9B rows again at the session's final code: batch-1 decode and an 8192-token prefill,
      # bf16 against FP8, in one call
      bf16_fp8 9b_b1 qwen3_5-9b-text --batch 1 --prompt 1024 --output 128
      bf16_fp8 9b_8k qwen3_5-9b-text --batch 1 --prompt 8192 --output 16
      date +%T ;;
    profiles)  # where issue 16's missed rows lose their time at the final code: batch-1 decode profiles of 9B and
      # 35B-A3B, bf16 and FP8 (FP8 experts on 35B), CUDA graphs on
      profile 9b_b1_bf16 qwen3_5-9b-text
      profile 35b-a3b_b1_bf16 qwen3_5-35b-a3b-text
      profile 9b_b1_fp8 qwen3_5-9b-text --engine-arg quantization=fp8
      profile 35b-a3b_b1_fp8 qwen3_5-35b-a3b-text --engine-arg quantization=fp8 --engine-arg enable_fp8_experts=true
      date +%T ;;
    race_i)  # test_fp8_cuda (it also ran the decode-graph wait test, since removed)
      group fp8_cuda $((170 - SECONDS)) tests/gpu/test_fp8_cuda.py
      date +%T ;;
    final_i)  # the final code: the FP8 GEMM tests (the cuBLAS probe's small N, the gated GEMV within its sum order)
      # and the FP8 checkpoints on CUDA; then the bf16 Granite-MoE-hybrid test whose decode-graph warm-up met a
      # device-side index assert under four workers (call2), twice in fresh processes; then test_model_cuda
      group fp8 200 tests/kernels/test_fp8_gemm.py tests/gpu/test_fp8_cuda.py
      for i in 1 2; do
        group granite_$i 60 tests/gpu/test_model_cuda.py -k "bfloat16 and granitemoehybrid"
      done
      group model $((585 - SECONDS)) tests/gpu/test_model_cuda.py
      date +%T ;;
    j1)  # the pre-norm in the FP8 decode GEMV (.before/ = 4df70fe, carried): its CUDA tests, 9B batch-1 decode bf16,
      # FP8, FP8 at .before, and the FP8 decode profile
      group fp8 200 tests/kernels/test_fp8_gemm.py -k "pre_norm or gated or gemv or weight_only" \
        tests/gpu/test_fp8_cuda.py
      offline bf16_9b_b1 qwen3_5-9b-text --batch 1 --prompt 1024 --output 128
      ab fp8_9b_b1 qwen3_5-9b-text --batch 1 --prompt 1024 --output 128 --engine-arg quantization=fp8
      date +%T; timeout $((580 - SECONDS)) python3 bench/decode_profile.py --config configs/qwen3_5-9b-text --batch 1 \
        --graphs --top 25 --engine-arg quantization=fp8 2>&1 | quiet | tee "$OUT/profile_9b_b1_fp8.md" | head -24
      date +%T ;;
    suite)  # the whole CUDA suite (tests/gpu, tests/kernels, the composed and FP8-checkpoint files) over 4 pytest
      # workers on the one GPU (the kernels' compiles and tunings run on the CPU cores), first failures listed
      timeout ${TESTS_TIMEOUT:-580} python3 -m pytest -q -n 4 -rfE -p no:cacheprovider --durations=15 tests/gpu \
        tests/kernels tests/test_composed_gpu.py tests/test_fp8_checkpoint.py 2>&1 | tee "$OUT/tests_suite.log" \
        | tail -40 ;;
    i3)  # the final code: 9B FP8 batch-1 decode profile (the gated gate_up GEMV in place of silu_and_mul), then on
      # CUDA the paged decode attention moved in f13879d (its kernel tests, the models through it) and the FP8 test
      # that i2's time limit cut
      date +%T; timeout 100 python3 bench/decode_profile.py --config configs/qwen3_5-9b-text --batch 1 --graphs \
        --top 25 --engine-arg quantization=fp8 2>&1 | quiet | tee "$OUT/profile_9b_b1_fp8.md" | head -24
      group paged 130 tests/kernels/test_paged_attention.py
      group model $((430 - SECONDS)) tests/gpu/test_model_cuda.py -k "triton or graphs"
      group fp8 $((500 - SECONDS)) tests/kernels/test_fp8_gemm.py -k "fp16_operands"
      date +%T ;;
    i2)  # the FP8 GEMV's deeper configs and silu_and_mul in the gate_up GEMV's epilogue (.before/ = 024c240, carried):
      # 9B batch-1 decode bf16, FP8, FP8 at .before; the GEMV table; the changed kernels' CUDA tests
      offline bf16_9b_b1 qwen3_5-9b-text --batch 1 --prompt 1024 --output 128
      ab fp8_9b_b1 qwen3_5-9b-text --batch 1 --prompt 1024 --output 128 --engine-arg quantization=fp8
      date +%T; timeout 170 python3 bench/fp8_gemv_variants.py 2>&1 | tee "$OUT/fp8_gemv_variants.md" \
        | grep -E "^\||copy|Error"
      group fp8 $((585 - SECONDS)) tests/gpu/test_fp8_cuda.py tests/kernels/test_fp8_gemm.py \
        -k "cuda_fp8 or gated or gemv or weight_only"
      date +%T ;;
    next_h)  # where the few-token expert GEMVs' fixed cost goes (up and down kernels' own device times, the rest of
      # the call, two empty kernels' floor); the FP8 GEMV's launch configs and its two widenings at one row; where 9B
      # FP8 batch-1 decode loses its time against bf16 (the 1.6x target)
      date +%T; timeout 90 python3 bench/moe_gemv_split.py --tokens 1 8 2>&1 | tee "$OUT/moe_gemv_split.md" \
        | grep -E "^\||copy|Error"
      date +%T; timeout 240 python3 bench/fp8_gemv_variants.py 2>&1 | tee "$OUT/fp8_gemv_variants.md" \
        | grep -E "^\||copy|Error"
      for q in none fp8; do
        date +%T; timeout 110 python3 bench/decode_profile.py --config configs/qwen3_5-9b-text --batch 1 --graphs \
          --top 25 $([ $q = fp8 ] && echo --engine-arg quantization=fp8) 2>&1 | quiet \
          | tee "$OUT/profile_9b_b1_$q.md" | head -32
      done
      date +%T ;;
    g1)  # the CUDA tests of the race for top_p rows past the candidates, one bf16 fault check (fault_f's first run),
      # the sampler's device time (peaked and flat rows; at 488b802 also the race against the search, since removed),
      # the FP8 GEMVs at HEAD
      # and in .before/ (the tree before the folded block scales, carried), then a second fault check if time is left
      group sampler 120 tests/kernels/test_sampling_kernels.py tests/gpu/test_sampler_cuda.py
      gemv16() {  # gemv16 N: bench/moe_kernels.py bf16 with the 16-bit experts' GEMV choice on, in a fresh process
        date +%T; timeout 60 python3 bench/with_flags.py triton_kernels.fused_moe.GEMV_16BIT=True -- \
          bench/moe_kernels.py --no-tune --no-profile --models 35B --tokens 1 2 4 8 2>&1 \
          | tee "$OUT/moe_bf16_gemv16_$1.md" | grep -E "^\||Error" | head -8
      }
      gemv16 1
      for scale in 4 0.5; do
        timeout 50 python3 bench/sampler_kernels.py --scale $scale --batch 1 64 2>&1 \
          | tee "$OUT/sampler_kernels_scale$scale.md" | grep -E "^\||copy|Error"
      done
      for tree in . .before; do
        date +%T; timeout 60 python3 $tree/bench/fp8_kernels.py --tokens 1 2>&1 | tee "$OUT/fp8_kernels${tree#.}.md" \
          | grep -E "^\||copy|Error"
        timeout 45 python3 $tree/bench/moe_down_variants.py --experts fp8 --tokens 1 8 2>&1 \
          | tee "$OUT/moe_down_variants${tree#.}.md" | grep -E "^\||copy|Error" | grep -v "slot loop | {"
      done
      [ $((550 - SECONDS)) -gt 60 ] && gemv16 2
      date +%T ;;
    g2)  # end to end: 9B greedy against top_p 0.9 alone (flat rows: the race) at batch 1 / 32 / 64, 9B FP8 batch 1,
      # 35B-A3B bf16 batch 1 with the 16-bit experts' GEMV choice off and on, 35B-A3B FP8 (experts too) batch 1;
      # then the FP8 GEMVs', the FP8 models' and the families' CUDA tests in what is left
      offline greedy_9b qwen3_5-9b-text --batch 1,32,64 --prompt 1024 --output 128
      offline t07p09_9b qwen3_5-9b-text --batch 1,32,64 --prompt 1024 --output 128 --sampling temperature=0.7 \
        --sampling top_p=0.9
      offline fp8_9b qwen3_5-9b-text --batch 1 --prompt 1024 --output 128 --engine-arg quantization=fp8
      for on in False True; do
        date +%T; timeout 100 python3 bench/with_flags.py triton_kernels.fused_moe.GEMV_16BIT=$on -- bench/offline.py \
          --config configs/qwen3_5-35b-a3b-text --batch 1 --prompt 512 --output 128 --skip-hf \
          --out "$OUT/offline_bf16_35b_b1_gemv16_$on.json" 2>&1 | quiet | tee "$OUT/offline_bf16_35b_b1_gemv16_$on.md" \
          | grep -E "^# |^\| 1 \| 512|fastest" | head -6
      done
      offline fp8_35b_b1 qwen3_5-35b-a3b-text --batch 1 --prompt 512 --output 128 --engine-arg quantization=fp8 \
        --engine-arg enable_fp8_experts=true
      left=$((555 - SECONDS)); [ $left -gt 30 ] && group models $left tests/kernels/test_moe_gemv.py \
        tests/kernels/test_fp8_gemm.py::test_weight_only_gemv_matches_reference \
        tests/kernels/test_fp8_gemm.py::test_weight_only_matches_reference \
        "tests/gpu/test_fp8_cuda.py::test_cuda_fp8_matches_the_cpu_reference[fp8]" \
        tests/gpu/test_fp8_cuda.py::test_cuda_fp8_experts_match_the_cpu_reference tests/gpu/test_fused_moe_cuda.py \
        tests/gpu/test_model_cuda.py
      date +%T ;;
    fault_f)  # prepared, not run: the bf16 fault of 2026-12-02e call2 with graph_time synchronizing first (2efcd6a):
      # bench/moe_kernels.py with the 16-bit experts' GEMV choice on, in three fresh processes, then the fault probe
      for n in 1 2 3; do
        date +%T; timeout 90 python3 bench/with_flags.py triton_kernels.fused_moe.GEMV_16BIT=True -- \
          bench/moe_kernels.py --no-tune --no-profile --models 35B --tokens 1 2 4 8 2>&1 | tee "$OUT/moe_bf16_$n.md" \
          | grep -E "^\||Error" | head -8
      done
      timeout 90 python3 bench/moe_fault_probe.py 2>&1 | tee "$OUT/moe_fault_probe.log" | tail -4 ;;
    last_e)  # 35B-A3B bf16 batch-1 decode with the 16-bit experts' GEMV choice off (served) and on, same call
      for on in False True; do
        date +%T; timeout 100 python3 bench/with_flags.py triton_kernels.fused_moe.GEMV_16BIT=$on -- bench/offline.py \
          --config configs/qwen3_5-35b-a3b-text --batch 1 --prompt 512 --output 128 --skip-hf \
          --out "$OUT/offline_bf16_35b_b1_gemv16_$on.json" 2>&1 | quiet | tee "$OUT/offline_bf16_35b_b1_gemv16_$on.md" \
          | grep -E "^# |^\| 1 \| 512" | head -3
      done ;;
    final_e)  # HEAD against the tree before this round's serving changes (.before/ = a4cb4b8, carried): the fused
      # MoE at T 1-8 as served (bf16 experts now choose through fastest.py too), 35B-A3B batch-1 decode bf16 and
      # FP8 each way, bf16 at batch 4; then the CUDA tests of the changed kernels and the MoE families
      date +%T; timeout 60 python3 bench/moe_kernels.py --no-tune --no-profile --models 35B --tokens 1 2 4 8 2>&1 \
        | tee "$OUT/moe_bf16.md" | grep -E "^\||copy|Error"
      ab bf16_35b_b1 qwen3_5-35b-a3b-text --batch 1 --prompt 512 --output 128
      ab fp8_35b_b1 qwen3_5-35b-a3b-text --batch 1 --prompt 512 --output 128 --engine-arg quantization=fp8 \
        --engine-arg enable_fp8_experts=true
      ab bf16_35b_b4 qwen3_5-35b-a3b-text --batch 4 --prompt 512 --output 128
      group kernels 150 tests/kernels/test_moe_gemv.py tests/kernels/test_gdn_recurrent.py
      group moe $((575 - SECONDS)) tests/gpu/test_fused_moe_cuda.py tests/gpu/test_model_cuda.py \
        -k "fused or graphs or triton and (qwen3_next or qwen3_5_moe or granitemoehybrid or nemotron_h or jamba)"
      date +%T ;;
    verify_e)  # the prepared variants timed (the MoE down GEMV's slot loop, the GDN last-program norm), then the
      # review mends of 2026-12-02 (d) on CUDA (shared autotuner timing, the route launcher, the FP8 decode
      # kernel's signature) and the slot loop's tests
      timeout 150 python3 bench/moe_down_variants.py --tokens 1 2 4 8 2>&1 | tee "$OUT/moe_down_variants.md" \
        | grep -E "^\||copy|Error"
      timeout 90 python3 bench/gdn_decode_norm.py --batch 1 8 64 2>&1 | tee "$OUT/gdn_decode_norm.md" \
        | grep -E "^\||Error"
      group kernels 220 tests/kernels/test_moe_gemv.py tests/kernels/test_gdn_recurrent.py \
        tests/kernels/test_moe_routing.py \
        tests/kernels/test_fp8_gemm.py
      group moe $((560 - SECONDS)) tests/gpu/test_fused_moe_cuda.py tests/gpu/test_fp8_cuda.py \
        tests/kernels/test_fused_moe.py tests/kernels/test_fastest.py
      date +%T ;;
    verify_d)  # the CUDA tests at the round's final code, most important first, in three pytest runs that each
      # print a summary: the changed kernels; every family against HF (model tests, FP8 models); the rest of tests/gpu
      group kernels 110 tests/kernels/test_gdn_recurrent.py tests/kernels/test_moe_routing.py tests/kernels/test_fp8_gemm.py
      group models 200 tests/gpu/test_model_cuda.py tests/gpu/test_fp8_cuda.py
      group rest $((525 - SECONDS)) tests/gpu/test_overlap_cuda.py tests/gpu/test_prefix_cache_cuda.py \
        tests/gpu/test_sampler_cuda.py tests/gpu/test_tensor_parallel_cuda.py tests/test_composed_gpu.py \
        tests/test_fp8_checkpoint.py tests/gpu/test_ssm_step_cuda.py tests/gpu/test_ssd_chunk_cuda.py \
        tests/gpu/test_fused_moe_cuda.py
      date +%T ;;
    fuse)  # the decode fusions (GDN gated norm in the delta-rule kernel, the MoE pre-norm in the router) and the FP8
      # GEMV summed after its loop: their CUDA tests and the model tests through them, then 35B-A3B bf16 at batch 1
      # against .before/ (the tree before them, carried), 35B-A3B FP8, 9B bf16 and FP8 at batch 1
      date +%T; timeout 170 python3 -m pytest -q -rfE -p no:cacheprovider --durations=10 tests/kernels/test_gdn_recurrent.py \
        tests/kernels/test_moe_routing.py tests/kernels/test_fp8_gemm.py tests/gpu/test_model_cuda.py \
        -k "norm or weight_only or real_shapes or graphs or triton and (qwen3_5 or qwen3_next or granite or jamba)" 2>&1 \
        | tee "$OUT/tests_fuse.log" | tail -12
      date +%T; offline bf16_35b_b1 qwen3_5-35b-a3b-text --batch 1 --prompt 512 --output 128
      date +%T; timeout 300 python3 .before/bench/offline.py --config configs/qwen3_5-35b-a3b-text --skip-hf --batch 1 \
        --prompt 512 --output 128 --out "$OUT/offline_before_bf16_35b_b1.json" 2>&1 | quiet \
        | tee "$OUT/offline_before_bf16_35b_b1.md" | sed -n '/## Decode$/,/## End/p' | head -6
      date +%T; offline fp8_35b_b1 qwen3_5-35b-a3b-text --batch 1 --prompt 512 --output 128 --engine-arg quantization=fp8 \
        --engine-arg enable_fp8_experts=true
      date +%T; offline bf16_9b_b1 qwen3_5-9b-text --batch 1 --prompt 512 --output 128
      date +%T; offline fp8_9b_b1 qwen3_5-9b-text --batch 1 --prompt 512 --output 128 --engine-arg quantization=fp8
      date +%T; left=$((570 - SECONDS)); [ $left -gt 40 ] && timeout $left python3 bench/decode_profile.py \
        --config configs/qwen3_5-35b-a3b-text --batch 1 --graphs --top 20 2>&1 | quiet | tee "$OUT/profile_35b_b1.md" \
        | tail -24 ;;
    head)  # the HEAD check of 2026-12-02 (d): tests/gpu as a whole (the fused MoE's CUDA tests among them), the bf16
      # fused MoE at T 1-16 again (the fault of 2026-12-02 (c)), the dense FP8 decode GEMMs with the LATE_SUM column
      timeout ${TESTS_TIMEOUT:-400} python3 -m pytest -q -rfE -p no:cacheprovider --durations=15 tests/gpu \
        tests/test_composed_gpu.py tests/test_fp8_checkpoint.py 2>&1 | tee "$OUT/tests_gpu.log" | tail -30
      timeout 45 python3 bench/moe_kernels.py --no-tune --no-profile --tokens 1 2 4 8 16 2>&1 \
        | tee "$OUT/moe_bf16.md" | grep -E "^\||copy|Error"
      left=$((575 - SECONDS)); [ $left -gt 30 ] && timeout $left python3 bench/fp8_decode_variants.py 2>&1 \
        | tee "$OUT/fp8_decode_variants.md" | grep -E "^\||copy|Error" ;;
    fp8gemv)  # prepared, not yet run: the dense FP8 GEMV summed after its K loop (LATE_SUM) against the served kernels on
      # the 9B shapes, its CUDA test, then 9B bf16 vs FP8 at batch 1
      timeout 60 python3 -m pytest -q -rfE -p no:cacheprovider tests/kernels/test_fp8_gemm.py -k "weight_only" 2>&1 \
        | tee "$OUT/tests_fp8gemv.log" | tail -4
      timeout 200 python3 bench/fp8_decode_variants.py 2>&1 | tee "$OUT/fp8_decode_variants.md" | grep -E "^\||copy|Error"
      bf16_fp8 9b_b1 qwen3_5-9b-text --batch 1 --prompt 512 --output 128 ;;
    moe6)  # the final MoE code in one short call: its CUDA tests (first failure stops), the FP8 fused MoE at T 1 / 2 / 8
      # (both few-token paths), 35B-A3B FP8 and bf16 at batch 1
      timeout 60 python3 -m pytest -q -x -rfE -p no:cacheprovider tests/kernels/test_fused_moe.py \
        tests/gpu/test_fused_moe_cuda.py -k "fp8 or unsorted or few_token and qwen3_5 or replay" 2>&1 \
        | tee "$OUT/tests_moe6.log" | tail -6
      timeout 40 python3 bench/moe_kernels.py --no-tune --no-profile --models 35B --tokens 1 2 8 --fp8 2>&1 \
        | tee "$OUT/moe_fp8.md" | grep -E "^\||copy|Error"
      offline fp8_35b_b1 qwen3_5-35b-a3b-text --batch 1 --prompt 512 --output 128 --engine-arg quantization=fp8 \
        --engine-arg enable_fp8_experts=true
      offline bf16_35b_b1 qwen3_5-35b-a3b-text --batch 1 --prompt 512 --output 128 ;;
    probe)  # where the bf16 fused MoE's device fault comes from: each step synced, with and without blocking launches
      timeout 100 env CUDA_LAUNCH_BLOCKING=1 python3 bench/moe_fault_probe.py 2>&1 | tee "$OUT/probe_blocking.log" | tail -25
      timeout 60 python3 bench/moe_fault_probe.py 2>&1 | tee "$OUT/probe.log" | tail -12
      timeout 60 python3 bench/moe_fault_probe.py --fp8 2>&1 | tee "$OUT/probe_fp8.log" | tail -12 ;;
    moe5)  # every launch config of the expert GEMVs alone, synced and checked (a faulting one is named and
      # skipped), then the GEMVs' and the fused MoE's CUDA tests (first failure stops), then bf16 fused MoE at T 1-16
      start=0
      while [ $SECONDS -lt 200 ]; do
        timeout 200 python3 bench/moe_gemv_check.py --start $start 2>&1 | tail -n +1 >> "$OUT/moe_gemv_check.log"
        next=$(cat /tmp/moe_gemv_check.next); [ "$next" = "$start" ] && break
        grep -q "^ *$((next - 1)) " "$OUT/moe_gemv_check.log" || echo "case $((next - 1)) FAULTED" >> "$OUT/moe_gemv_check.log"
        start=$next; [ "$(python3 -c 'import sys; sys.path.insert(0, "."); from bench.moe_gemv_check import cases; print(len(cases()))')" -le "$start" ] && break
      done
      grep -E "FAULT|err [0-9.e+-]+" "$OUT/moe_gemv_check.log" | tail -80
      timeout 200 python3 -m pytest -q -x -rfE -p no:cacheprovider --durations=8 tests/kernels/test_moe_gemv.py \
        tests/gpu/test_fused_moe_cuda.py 2>&1 | tee "$OUT/tests_moe5.log" | tail -30
      timeout 100 python3 bench/moe_kernels.py --no-tune --no-profile --tokens 1 2 4 8 16 2>&1 \
        | tee "$OUT/moe_bf16.md" | grep -E "^\||copy|Error" ;;
    moe4)  # the few-token expert GEMVs (moe_gemv.py): their CUDA tests and the fused MoE's, the fused MoE at T 1-16
      # with both few-token paths (bf16, FP8), then 35B-A3B bf16 and FP8 (experts too) decode at batch 1
      timeout 170 python3 -m pytest -q -rfE -p no:cacheprovider --durations=5 tests/kernels/test_moe_gemv.py \
        tests/kernels/test_fused_moe.py tests/gpu/test_fused_moe_cuda.py 2>&1 | tee "$OUT/tests_moe4.log" | tail -8
      timeout 100 python3 bench/moe_kernels.py --no-tune --no-profile --tokens 1 2 4 8 16 2>&1 \
        | tee "$OUT/moe_bf16.md" | grep -E "^\||copy|Error"
      timeout 80 python3 bench/moe_kernels.py --no-tune --no-profile --fp8 --models 35B --tokens 1 2 8 16 2>&1 \
        | tee "$OUT/moe_fp8.md" | grep -E "^\||copy|Error"
      offline bf16_35b_b1 qwen3_5-35b-a3b-text --batch 1 --prompt 512 --output 128
      offline fp8_35b_b1 qwen3_5-35b-a3b-text --batch 1 --prompt 512 --output 128 --engine-arg quantization=fp8 \
        --engine-arg enable_fp8_experts=true ;;
    e2e35)  # 35B-A3B bf16 and FP8 (experts too) decode
      offline bf16_35b qwen3_5-35b-a3b-text --batch 1,32 --prompt 512 --output 128
      offline fp8_35b qwen3_5-35b-a3b-text --batch 1,32 --prompt 512 --output 128 --engine-arg quantization=fp8 \
        --engine-arg enable_fp8_experts=true ;;
    e2e35b1)  # 35B-A3B bf16 and FP8 (experts too) decode at batch 1 only
      offline bf16_35b_b1 qwen3_5-35b-a3b-text --batch 1 --prompt 512 --output 128
      offline fp8_35b_b1 qwen3_5-35b-a3b-text --batch 1 --prompt 512 --output 128 --engine-arg quantization=fp8 \
        --engine-arg enable_fp8_experts=true ;;
    kernels_left)  # the kernel tests of the MoE and FP8 files, in whatever is left of a 560 s call
      left=$((560 - SECONDS)); [ $left -gt 30 ] && timeout $left python3 -m pytest -q -rfE -p no:cacheprovider \
        tests/kernels/test_moe_routing.py tests/kernels/test_fused_moe.py tests/kernels/test_fp8_gemm.py \
        tests/test_fp8_checkpoint.py tests/test_composed_gpu.py 2>&1 | tee "$OUT/tests_kernels_left.log" | tail -12 ;;
    final35)  # the one-launch router on CUDA; 35B-A3B bf16 and FP8 at batch 1, each profiled; MoE configs in what is left
      timeout 150 python3 -m pytest -q -rfE -p no:cacheprovider --durations=8 tests/kernels/test_moe_routing.py \
        tests/gpu/test_model_cuda.py -k "not bfloat16 and (moe or next or granite or jamba or graphs or route or router \
        or topk or ref or strided or shared or rejects)" 2>&1 | tee "$OUT/tests_route.log" | tail -12
      offline bf16_35b_b1 qwen3_5-35b-a3b-text --batch 1 --prompt 512 --output 128
      offline fp8_35b_b1 qwen3_5-35b-a3b-text --batch 1 --prompt 512 --output 128 --engine-arg quantization=fp8 \
        --engine-arg enable_fp8_experts=true
      timeout 100 python3 bench/decode_profile.py --config configs/qwen3_5-35b-a3b-text --batch 1 --graphs --top 16 \
        2>&1 | quiet | tee "$OUT/profile_35b_b1.md" | tail -20
      timeout 100 python3 bench/decode_profile.py --config configs/qwen3_5-35b-a3b-text --batch 1 --graphs --top 16 \
        --engine-arg quantization=fp8 --engine-arg enable_fp8_experts=true 2>&1 | quiet \
        | tee "$OUT/profile_35b_b1_fp8.md" | tail -20
      left=$((560 - SECONDS)); [ $left -gt 30 ] && timeout $left python3 bench/moe_kernels.py --no-profile --models 35B \
        --tokens 1 8 2>&1 | tee "$OUT/moe_tune.md" | grep -E "^\||tuning|^  [0-9]" | head -40 ;;
    sampleprof)  # where 9B decode at batch 64 spends its time, greedy against temperature 0.7 + top_p 0.9 + top_k 50
      for sampling in "" "--sampling temperature=0.7 --sampling top_p=0.9 --sampling top_k=50"; do
        timeout 150 python3 bench/decode_profile.py --batch 64 --graphs --top 25 $sampling 2>&1 | quiet \
          | tee -a "$OUT/profile_9b_b64_sampling.md" | tail -30
      done ;;
    profile35)  # where a 35B-A3B batch-1 step goes; then eagerly, its cuBLAS matmuls by shape
      timeout 150 python3 bench/decode_profile.py --config configs/qwen3_5-35b-a3b-text --batch 1 --graphs --top 25 \
        2>&1 | quiet | tee "$OUT/profile_35b_b1.md" | tail -32
      timeout 150 python3 bench/decode_profile.py --config configs/qwen3_5-35b-a3b-text --batch 1 --shapes --top 12 \
        2>&1 | quiet | tee "$OUT/profile_35b_b1_shapes.md" | tail -16 ;;
    fp8kernels)  # the FP8 GEMM against bf16 cuBLAS on the 9B linear shapes
      timeout 200 python3 bench/fp8_kernels.py 2>&1 | tee "$OUT/fp8_kernels.md" | grep -E "^\||copy" ;;
    tp1)  # tp 1 before (884e704, archived into .before/ and carried) and after the tensor-parallel rewrite
      for i in 1 2; do  # twice each, interleaved, so drift shows
        offline head_9b_$i qwen3_5-9b-text --batch 1,32 --prompt 512 --output 128
        timeout 300 python3 .before/bench/offline.py --config configs/qwen3_5-9b-text --skip-hf --batch 1,32 \
          --prompt 512 --output 128 --out "$OUT/offline_before_9b_$i.json" 2>&1 | quiet \
          | tee "$OUT/offline_before_9b_$i.md" | sed -n '/## Decode$/,/## End/p' | head -12
      done ;;
  esac
done
# Only 8 files come back from a call: everything under $OUT travels as one archive.
(cd "$OUT" && tar czf /tmp/results.tgz . && find . -mindepth 1 -delete && mv /tmp/results.tgz results.tgz)
