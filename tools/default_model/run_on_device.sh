#!/usr/bin/env bash
# On the GPU machine (no network): install the wheels from device_wheels.sh, train, and leave in $OUT the
# checkpoint as a tar split into 15 MiB parts, the log and TRAINING.md. Extra arguments go to train.py.
#   bash tools/default_model/run_on_device.sh [--max-steps N ...]
# Needs .whl_train/ (device_wheels.sh) and .data/default_model/ (prepare_data.py) beside the repo's files.
# Back here: bash tools/default_model/unpack_checkpoint.sh DIR_WITH_PARTS
set -euo pipefail
cd "$(dirname "$0")/../.."
out="${OUT:?OUT must name the folder to fill}"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/default-model-site \
  .whl_train/*.whl
export PYTHONPATH="/tmp/default-model-site${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
checkpoint=/tmp/default-model
rm -rf "$checkpoint"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader || true
python3 tools/default_model/train.py --out "$checkpoint" "$@" 2>&1 | grep -v "falling back" | tee "$out/train.log"
cp "$checkpoint/TRAINING.md" "$out/"
tar -C "$checkpoint" -cf - . | split -b 15M - "$out/default-model.tar.part-"
ls -la "$out"
