# Sourced by the bench/h200*_run.sh scripts on the GPU machine: strict mode, $OUT for the logs
# (default /tmp/hybrid_sgl_bench), the carried wheels (WHEELS, default: the folder given to
# `device_env` or .whl_srv) installed into /tmp/site and put on PYTHONPATH with the repository, the
# GPUs named in $OUT/gpu.txt, `quiet`, a filter for load progress and per-layer log lines, and `cut_35b`.
set -uo pipefail
export PYTHONUNBUFFERED=1
export USE_HUB_KERNELS=${USE_HUB_KERNELS:-0}  # HF anchors run HF's own code: no `kernels` layers (no hub here)
OUT=${OUT:-/tmp/hybrid_sgl_bench}
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site \
  "${WHEELS:-${DEFAULT_WHEELS:-.whl_srv}}"/*.whl
export PYTHONPATH=$PWD:/tmp/site
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader | tee "$OUT/gpu.txt"
quiet() { grep -v "^\[transformers\]\|loading weights: \|layer  *[0-9]*:"; }
cut_35b() {  # configs/tmp_35b_20l: 35B-A3B's first 20 layers (its bf16 weights fit one H100), made on the GPU machine
  python3 -c "import json, os; c = json.load(open('configs/qwen3_5-35b-a3b-text/config.json')); \
c.update(num_hidden_layers=20, layer_types=c['layer_types'][:20]); os.makedirs('configs/tmp_35b_20l', exist_ok=True); \
json.dump(c, open('configs/tmp_35b_20l/config.json', 'w'))"
}
