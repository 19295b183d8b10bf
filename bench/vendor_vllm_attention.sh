#!/usr/bin/env bash
# Extract the pure-Python modules that vLLM's Triton `unified_attention` needs into .vllm_min/
# (git-ignored through .git/info/exclude), so triton_kernels/vllm_attention.py can run it without
# vLLM's compiled extensions:  PYTHONPATH=.vllm_min python bench/attention_kernels.py
#
#   bash bench/vendor_vllm_attention.sh                 # pip-downloads the wheel (needs PyPI)
#   bash bench/vendor_vllm_attention.sh path/to/vllm-*.whl
#
# Nothing from vLLM is committed. The module list was found by importing
# vllm.v1.attention.ops.triton_unified_attention with a stand-in platform and listing sys.modules.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DEST="$ROOT/.vllm_min"
VERSION="${VLLM_VERSION:-0.33.0}"
PYTHON="${PYTHON:-python}"
WHEEL="${1:-}"

if [ -z "$WHEEL" ]; then
    TMP="$(mktemp -d)"
    trap 'rm -rf "$TMP"' EXIT
    "$PYTHON" -m pip download --quiet --no-deps "vllm==$VERSION" -d "$TMP"
    WHEEL="$(ls "$TMP"/vllm-*.whl)"
fi

MODULES="
vllm/__init__.py
vllm/_version.py
vllm/env_override.py
vllm/envs.py
vllm/logger.py
vllm/logging_utils/__init__.py
vllm/logging_utils/formatter.py
vllm/logging_utils/lazy.py
vllm/logging_utils/log_time.py
vllm/logging_utils/torch_tensor.py
vllm/logging_utils/uvicorn_logging.py
vllm/platforms/__init__.py
vllm/platforms/interface.py
vllm/plugins/__init__.py
vllm/triton_utils/__init__.py
vllm/triton_utils/importing.py
vllm/triton_utils/tensor_descriptor.py
vllm/utils/__init__.py
vllm/utils/import_utils.py
vllm/utils/math_utils.py
vllm/utils/platform_utils.py
vllm/utils/torch_utils.py
vllm/utils/torch_version.py
vllm/v1/__init__.py
vllm/v1/attention/__init__.py
vllm/v1/attention/backends/__init__.py
vllm/v1/attention/backends/registry.py
vllm/v1/attention/ops/__init__.py
vllm/v1/attention/ops/triton_attention_helpers.py
vllm/v1/attention/ops/triton_unified_attention.py
vllm/v1/kv_cache_interface.py
vllm/v1/kv_cache_layout.py
vllm/v1/kv_cache_spec_registry.py
vllm/version.py
"

rm -rf "$DEST"
mkdir -p "$DEST"
# METADATA lets importlib.metadata.version("vllm") answer, which vLLM's Triton check asks.
"$PYTHON" - "$WHEEL" "$DEST" $MODULES <<'PY'
import sys
import zipfile

wheel, dest, *modules = sys.argv[1:]
with zipfile.ZipFile(wheel) as zf:
    names = set(zf.namelist())
    dist_info = sorted({n.split("/")[0] for n in names if n.split("/")[0].endswith(".dist-info")})
    assert len(dist_info) == 1, f"expected one .dist-info in {wheel}, found {dist_info}"
    wanted = modules + [f"{dist_info[0]}/METADATA", f"{dist_info[0]}/licenses/LICENSE"]
    missing = [m for m in wanted if m not in names]
    if missing:
        sys.exit(f"{wheel} lacks {missing}: the module list above fits vLLM 0.33; re-derive it for this version")
    for m in wanted:
        zf.extract(m, dest)
    print(f"{len(wanted)} files from {wheel.rsplit('/', 1)[-1]} -> {dest}")
PY

EXCLUDE="$(git -C "$ROOT" rev-parse --git-path info/exclude)"
case "$EXCLUDE" in /*) ;; *) EXCLUDE="$ROOT/$EXCLUDE" ;; esac
mkdir -p "$(dirname "$EXCLUDE")"
grep -qxF '/.vllm_min/' "$EXCLUDE" 2>/dev/null || echo '/.vllm_min/' >> "$EXCLUDE"
du -sh "$DEST"
