#!/usr/bin/env bash
# Download (on a machine with PyPI access) the pure-Python and manylinux wheels that the HTTP server
# (`import hybrid_sgl.launch_server`) and the HF transformers anchor (with fla-core's kernels) need
# on a GPU machine that has torch, triton, numpy and their dependencies. Versions are the ones this
# repository is tested with; about 25 MB, so they travel with the tree. The wheels go into the
# git-ignored .whl_srv/; install them on the GPU machine with
#   python3 -m pip install --no-index --no-deps --target /tmp/site .whl_srv/*.whl
# and run with PYTHONPATH=$PWD:/tmp/site (bench/device_env.sh does both; the bench/h200*_run.sh scripts source it).
#   bash bench/device_wheels.sh [DEST=.whl_srv] [PYTHON_VERSION=3.12]
set -euo pipefail
cd "$(dirname "$0")/.."
dest="${1:-.whl_srv}"
python_version="${2:-3.12}"
pip="${PIP:-.venv/bin/pip}"
wheels=(
  # HTTP server
  fastapi==0.165.0 starlette==1.10.0 annotated-doc==0.0.7 opentelemetry-api==1.45.2
  pydantic==2.14.4 pydantic-core==2.50.5 annotated-types==0.8.0 typing-inspection==0.4.5
  uvicorn==0.54.0 click==8.5.1 h11==0.16.0 anyio==4.16.0 sniffio==1.3.1 idna==3.20
  typing-extensions==4.16.0
  # tokenizer, checkpoint loading, HF transformers (the anchor and the tokenizer classes)
  # (not transformers' `kernels` and rich's pygments: USE_HUB_KERNELS=0 in device_env.sh and tests/conftest.py keeps
  # HF's own layers, so nothing imports them, and without them the wheels and the tree fit the 64 MiB a call carries)
  transformers==5.25.0 tomlkit==0.15.3 typer==0.29.2 rich==15.0.0 markdown-it-py==4.3.0 mdurl==0.1.2
  shellingham==1.5.4 tokenizers==0.23.3 safetensors==0.8.0 huggingface_hub==2.4.0
  regex==2026.11.19 pyyaml==6.0.4 tqdm==4.70.1 packaging==26.4
  httpx2==2.16.2 httpcore2==2.16.2 truststore==0.10.5 certifi==2026.10.19.post1
  # the anchor's GDN kernels
  fla-core==0.6.0 einops==0.8.2
  # metrics and the grammar backend
  prometheus-client==0.26.0 xgrammar==0.2.9 apache-tvm-ffi==0.1.15.post2
  # the CUDA suite over several pytest workers
  pytest-xdist==3.8.0 execnet==2.1.2
)
mkdir -p "$dest"
$pip download -q --no-deps --only-binary=:all: --python-version "$python_version" --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  --platform any -d "$dest" "${wheels[@]}" 2> >(grep -v "is ignored" >&2)
ls "$dest"
# what a device call carries: the tracked and untracked-not-ignored files, and the wheels (at most 64 MiB)
tree=$(git ls-files -z --cached --others --exclude-standard | xargs -0 stat -c %s 2>/dev/null | awk '{s += $1} END {print s}')
wheels_bytes=$(du -sb "$dest" | cut -f1)
echo "tree $((tree / 1048576)) MiB + wheels $((wheels_bytes / 1048576)) MiB = $(((tree + wheels_bytes) / 1048576)) MiB of the 64 a call carries"
