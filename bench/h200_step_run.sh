#!/usr/bin/env bash
# Every step fast, on one H200 in one or two calls: the CUDA tests of the step graphs, the step profile
# (graphs on and off in one process) of the 9B, Nemotron-H-8B and Falcon-H1-7B shapes, the prefix-hit TTFT
# and the multi-turn serving run with the cache on and off, and the whole CUDA suite. Run from the repo
# root with the wheel folder carried (WHEELS, default .whl_srv; bench/device_wheels.sh fills it).
# `spec` (under six minutes): the speculative-decoding, short-row and snapshot-cut CUDA tests, then the 9B
# verify and decode steps with their top kernels and a cProfile of the eager steps.
# `specbench`: tok/s with speculative decoding on / off, 9B shape, TEST-ONLY forced acceptance 0.81 (SPEC_PROFILE=1:
#   with the engine loop's cProfile and the kernels of each timed run in spec_profile.txt; SPEC_TOKEN_MAP=top:32768:
#   the drafts choose among 32k token ids, --speculative-token-map; SPEC_LIMITS=0,default: one spec run per
#   --speculative-disable-by-batch-size, 0 timing the speculative pipeline at every batch size; SPEC_ROLLBACKS=
#   snapshots,replay: one spec run per --speculative-rollback; SPEC_CHAIN=1: the spec runs chain their iterations
#   (the default; else --disable-speculative-overlap)). `chain`: the chained iterations' CUDA tests, then specbench on the host path and
#   chained (SPEC_BATCH default 1,16,64, SPEC_LIMITS default 0: drafts at every batch size).
# `mamba`: the step profile of the Nemotron-H-8B and Falcon-H1-7B shapes (MAMBA_CONFIGS: others; TOP_KERNELS=N: each case's N kernels with
#   the most device time, with their calls a step). `profile` and `mamba`: HOST_OPS=N lists each eager case's N host ops
#   (aten ops, CUDA runtime and driver calls) of most own CPU time.
# `prefix`: the shared-prefix (SHARED_REQUESTS, default 1000) and unrelated-prompts workloads, cache on / off.
# `rollback`: bench/verify_rollback.py (the two GDN rollback designs); `unrelated`: the unrelated-prompts workload with the
#   cache on, off, and on without the fixed snapshot cuts (UNRELATED_CONFIG: another shape; FIXED_CUTS_RUN=0: the first two only).
# `multiturn`: 48 users x 6 turns over HTTP, cache on and off (MULTITURN_FLAGS: more launch_server flags for both servers).
# `suite`: the CUDA suite (SUITE_ARGS: other pytest arguments, e.g. @FILE of test ids).
# `launch`: bench/launch_overhead.py and the cached-launch CUDA test.
# `cuts`: the 8 x 1k prefill step with and without the default snapshot cuts, with this tree's kernels and older ones
#   carried in .before/triton_kernels (CUTS_WINDOWS="128 64": also with the SSD kernel's 64-token update windows).
# `few_rows`: decode b1 / b32 steps as served (eager steps' linears on cuBLAS) and with HYBRID_SGL_FEW_ROWS_GEMM=2 (the few-rows
#   GEMM in eager steps too, as before).
# `moe_prefill`: the step profile of Qwen3.5-35B-A3B's first 20 layers (MOE_CASES, default: prefill 8k and 2k, decode b32).
# `prefix_cache_only`: the shared-prefix workload (SHARED_REQUESTS, default 2000) with the cache on, per config in
#   PREFIX_CONFIGS (default: the 9B and Nemotron-H-8B shapes): hit rate, tok/s, mean TTFT.
#   bash bench/h200_step_run.sh [tests|profile|mamba|launch|ttft|multiturn|suite|model_cuda|spec|specbench|chain|prefix|prefix_cache_only|moe_prefill|tests_fp8_spec|mtp_default|rollback|unrelated|cuts|few_rows ...]   (default: tests profile)
. "$(dirname "$0")/device_env.sh"
git rev-parse HEAD > "$OUT/commit.txt" 2>/dev/null || true  # the tree that travels may carry an older .git: results record the commit by hand too

for part in ${*:-tests profile}; do
  case $part in
    tests)
      timeout 420 python3 -m pytest -q -rf -x -p no:cacheprovider -n 4 tests/gpu/test_step_graphs_cuda.py \
        tests/gpu/test_model_cuda.py tests/gpu/test_overlap_cuda.py tests/gpu/test_prefix_cache_cuda.py \
        tests/test_decode_graph_inputs.py 2>&1 | tee "$OUT/tests_step_graphs.log" | tail -15 ;;
    profile)
      timeout 420 python3 bench/step_profile.py --config configs/qwen3_5-9b-text ${PROFILE_CASES:+--cases "$PROFILE_CASES"} \
        ${HOST_PROFILE:+--host-profile "$OUT/host_profile_9b.txt"} ${HOST_OPS:+--host-ops $HOST_OPS} --out "$OUT/step_profile_9b.json" \
        2>&1 | quiet | tee "$OUT/step_profile_9b.log" | tail -24 ;;
    mamba)
      for c in ${MAMBA_CONFIGS:-nemotron_h-8b falcon_h1-7b}; do
        timeout 300 python3 bench/step_profile.py --config configs/$c --cases "${MAMBA_CASES:-decode b1,decode b32,extend 64 after 4k,prefill 2k}" \
          --top-kernels ${TOP_KERNELS:-0} ${HOST_PROFILE:+--host-profile "$OUT/host_profile_$c.txt"} ${HOST_OPS:+--host-ops $HOST_OPS} \
          --out "$OUT/step_profile_$c.json" 2>&1 | quiet | tee "$OUT/step_profile_$c.log" | tail -16
      done ;;
    ttft)
      timeout 300 python3 bench/prefix_cache.py offline --config configs/qwen3_5-9b-text --cases ttft \
        --out "$OUT/prefix_ttft_9b.json" 2>&1 | quiet | tee "$OUT/prefix_ttft_9b.log" | tail -12 ;;
    multiturn)
      timeout 400 python3 bench/prefix_cache.py multiturn --config configs/qwen3_5-9b-text --users 48 --turns 6 \
        ${MULTITURN_FLAGS:+--server-args "$MULTITURN_FLAGS"} --out "$OUT/multiturn_9b.json" 2>&1 | quiet | tee "$OUT/multiturn_9b.log" | tail -6 ;;
    spec)
      timeout 150 python3 -m pytest -q -rf -p no:cacheprovider -n 3 tests/gpu/test_speculative_cuda.py tests/kernels/test_gdn_short_rows.py \
        tests/gpu/test_step_graphs_cuda.py::test_snapshot_cuts_inside_graphed_extend_steps tests/gpu/test_warm_up_cuda.py 2>&1 \
        | tee "$OUT/tests_spec.log" | tail -8
      timeout 170 python3 bench/step_profile.py --config configs/qwen3_5-9b-text --steps 5 \
        --cases "decode b1,verify 4 b1,decode b32,verify 4 b32" --top-kernels 12 --host-profile "$OUT/host_profile.txt" \
        --out "$OUT/step_profile_spec.json" 2>&1 | quiet | tee "$OUT/step_profile_spec.log" | tail -90 ;;
    specbench)
      timeout ${SPEC_TIMEOUT:-560} python3 bench/spec_decode.py --config configs/qwen3_5-9b-text --batch ${SPEC_BATCH:-1,64} \
        --prompt 512 --output 128 --accept 0.81 --limits "${SPEC_LIMITS:-default}" --rollbacks "${SPEC_ROLLBACKS:-snapshots}" \
        --out "/tmp/spec_decode_9b${SPEC_CHAIN:+_chain}.json" ${SPEC_PROFILE:+--profile "$OUT/spec_profile.txt"} \
        ${SPEC_TOKEN_MAP:+--token-map "$SPEC_TOKEN_MAP"} ${SPEC_CHAIN:+--chain} 2>&1 | quiet \
        | tee "$OUT/spec_decode_9b${SPEC_CHAIN:+_chain}.log" | tail -12; cp /tmp/spec_decode_9b${SPEC_CHAIN:+_chain}.json "$OUT/" ;;
    chain)  # chained speculative iterations: their CUDA tests, then tok/s chained against the host path, one call
      timeout 240 python3 -m pytest -q -rf -p no:cacheprovider -n 3 tests/gpu/test_speculative_cuda.py \
        tests/kernels/test_state_rows.py 2>&1 | tee "$OUT/tests_chain.log" | tail -6
      for mode in host chain; do
        timeout ${SPEC_TIMEOUT:-270} python3 bench/spec_decode.py --config configs/qwen3_5-9b-text --batch ${SPEC_BATCH:-1,16,64} \
          --prompt 512 --output 128 --accept 0.81 --limits "${SPEC_LIMITS:-0}" --out "/tmp/spec_decode_9b_$mode.json" \
          $([ $mode = chain ] && echo --chain) 2>&1 | quiet | tee "$OUT/spec_decode_9b_$mode.log" | tail -8
        cp "/tmp/spec_decode_9b_$mode.json" "$OUT/"
      done ;;
    prefix)  # the shared-prefix and unrelated-prompts workloads, cache on and off
      timeout 330 python3 bench/prefix_cache.py offline --config configs/qwen3_5-9b-text --cases shared,random \
        --shared-requests "${SHARED_REQUESTS:-1000}" --out "$OUT/prefix_9b.json" 2>&1 | quiet | tee "$OUT/prefix_9b.log" \
        | grep -E "hit_rate|output_tok_s|mean_ttft|rror" ;;
    prefix_cache_only)  # the shared-prefix workload with the cache on only (its hit rate), per config in PREFIX_CONFIGS
      for c in ${PREFIX_CONFIGS:-qwen3_5-9b-text nemotron_h-8b}; do
        timeout ${PREFIX_TIMEOUT:-250} python3 bench/prefix_cache.py offline-one --variant cache --config configs/$c \
          --cases shared --shared-requests "${SHARED_REQUESTS:-2000}" --out "$OUT/prefix_shared_$c.json" 2>&1 | quiet \
          | tee "$OUT/prefix_shared_$c.log" | grep -E "hit_rate|output_tok_s|mean_ttft|rror"
      done ;;
    tests_fp8_spec)  # the FP8 GEMMs (the few-rows choice included) and FP8 models, speculative decoding on CUDA
      timeout ${TESTS_TIMEOUT:-330} python3 -m pytest -q -rf -p no:cacheprovider -n 4 tests/kernels/test_fp8_gemm.py \
        tests/gpu/test_fp8_cuda.py tests/gpu/test_speculative_cuda.py 2>&1 | tee "$OUT/tests_fp8_spec.log" | tail -12 ;;
    mtp_default)  # the default model's trained MTP layer: accept length on held-out text, tok/s with drafts on / off
      # (here, first: python tools/default_model/prepare_data.py; carry .data/default_model/validation.jsonl)
      timeout 300 python3 tools/default_model/mtp_accept.py --json "$OUT/mtp_accept.json" 2>&1 | quiet \
        | tee "$OUT/mtp_accept.log" | tail -20 ;;
    rollback)  # the GDN rollback of a verify step: snapshot rows and a copy against a checkpoint and a replay
      timeout 120 python3 bench/verify_rollback.py 2>&1 | tee "$OUT/verify_rollback.md" ;;
    unrelated)  # 256 unrelated 1k prompts: the cache on and off, then on without the fixed cuts (their cost; FIXED_CUTS_RUN=0: not)
      c=${UNRELATED_CONFIG:-qwen3_5-9b-text}
      timeout 200 python3 bench/prefix_cache.py offline --config configs/$c --cases random \
        --out "$OUT/prefix_random_$c.json" 2>&1 | quiet > "$OUT/prefix_random_$c.log"
      [ "${FIXED_CUTS_RUN:-1}" = 0 ] || timeout 110 python3 bench/prefix_cache.py offline-one --variant cache \
        --config configs/$c --cases random --engine-arg snapshot_interval=1000000 \
        --out "$OUT/prefix_random_nofixedcuts_$c.json" 2>&1 | quiet > "$OUT/prefix_random_nofixedcuts_$c.log"
      grep -hE "output_tok_s|mean_ttft|rror" "$OUT"/prefix_random*.log ;;
    cuts)  # the unrelated workload's step (8 cold 1k prompts) with and without the cache's default cuts, top kernels;
      # the same with older kernels carried in .before/triton_kernels (the modules not there come from this tree)
      for c in ${CUTS_CONFIGS:-qwen3_5-9b-text nemotron_h-8b}; do
        for tree in . .before; do
          [ -d "$tree/triton_kernels" ] || continue
          [ "$tree" = . ] || { mkdir -p "$tree/bench"; cp bench/step_profile.py "$tree/bench/"; }
          for w in ${CUTS_WINDOWS:-128}; do  # the SSD state kernel's update windows with cuts (64: HYBRID_SGL_SSD_SNAPSHOT_WINDOW)
            HYBRID_SGL_SSD_SNAPSHOT_WINDOW=$w timeout 150 python3 "$tree/bench/step_profile.py" --config configs/$c \
              --steps 10 --top-kernels 8 --cases "prefill 8x1k,prefill 8x1k default cuts" \
              --out "$OUT/cuts_${c}_${tree#.}w$w.json" 2>&1 | quiet | tee "$OUT/cuts_${c}_${tree#.}w$w.log" \
              | grep -E "^\| prefill|rror" | head -8
          done
        done
      done ;;
    few_rows)  # decode steps as served and with the few-rows GEMM in eager steps too (HYBRID_SGL_FEW_ROWS_GEMM=2)
      for c in ${FEW_ROWS_CONFIGS:-falcon_h1-7b qwen3_5-9b-text}; do
        for f in 1 2; do
          HYBRID_SGL_FEW_ROWS_GEMM=$f timeout 200 python3 bench/step_profile.py --config configs/$c --steps 10 \
            --cases "decode b1,decode b32" --out "$OUT/few_rows${f}_$c.json" 2>&1 | quiet \
            | tee "$OUT/few_rows${f}_$c.log" | grep -E "^\| decode|rror" | head -8
        done
      done ;;
    launch)  # cached Triton launches: host us a launch both ways, the CUDA test against Triton's own launches
      timeout 120 python3 bench/launch_overhead.py 2>&1 | quiet | tee "$OUT/launch_overhead.md"
      timeout 200 python3 -m pytest -q -rf -p no:cacheprovider tests/gpu/test_cached_launch_cuda.py 2>&1 \
        | tee "$OUT/tests_cached_launch.log" | tail -4 ;;
    moe_prefill)  # Qwen3.5-35B-A3B's first 20 layers (bf16 fits one H100): the 8k prefill step, its device-idle share
      cut_35b
      timeout ${MOE_TIMEOUT:-200} python3 bench/step_profile.py --config configs/tmp_35b_20l --steps 5 \
        --cases "${MOE_CASES:-prefill 8k,prefill 2k,decode b32}" --top-kernels 12 --out "$OUT/step_profile_35b20.json" 2>&1 \
        | quiet | tee "$OUT/step_profile_35b20.log" | tail -30 ;;
    suite)  # -v: each result is named as it completes, so a run cut by its limit still names its failures
      timeout ${SUITE_TIMEOUT:-560} python3 -m pytest -v --tb=short -rf -p no:cacheprovider -n 4 \
        ${SUITE_ARGS:-tests/gpu tests/kernels tests/test_composed_gpu.py tests/test_fp8_checkpoint.py} > "$OUT/suite.log" 2>&1
      grep -E "FAILED|ERROR" "$OUT/suite.log" | head -40; tail -3 "$OUT/suite.log" ;;
    model_cuda)  # the HF-parity tests on CUDA, each failure with its whole traceback
      timeout ${SUITE_TIMEOUT:-300} python3 -m pytest -v --tb=long -rf -p no:cacheprovider -n 4 tests/gpu/test_model_cuda.py \
        > "$OUT/model_cuda.log" 2>&1; grep -E "FAILED|^E  " "$OUT/model_cuda.log" | head -60; tail -2 "$OUT/model_cuda.log" ;;
  esac
done
