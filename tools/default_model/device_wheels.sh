#!/usr/bin/env bash
# Download the wheels that train.py needs beside torch on a GPU machine without network (CPython 3.12,
# x86_64 Linux): transformers and the packages it imports. run_on_device.sh installs them.
#   bash tools/default_model/device_wheels.sh [DEST=.whl_train] [PYTHON_VERSION=3.12]
# DEST ignores itself (.gitignore '*'), so the training run carries it explicitly.
set -euo pipefail
dest="${1:-.whl_train}"
python_version="${2:-3.12}"
pip="${PIP:-.venv/bin/pip}"
wheels=(
  transformers==5.24.0 tokenizers==0.23.3 safetensors==0.8.0 huggingface_hub==2.4.0
  numpy==2.4.6 regex==2026.11.19 pyyaml==6.0.4 tqdm==4.70.1 packaging==26.4
  httpx2==2.16.2 httpcore2==2.16.2 anyio==4.16.0 idna==3.20 certifi==2026.10.19.post1 h11==0.16.0
  truststore==0.10.5
)
mkdir -p "$dest"
echo '*' > "$dest/.gitignore"
"$pip" download -q --no-deps --only-binary=:all: --python-version "$python_version" --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  -d "$dest" "${wheels[@]}"
du -sh "$dest"
