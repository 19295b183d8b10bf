#!/usr/bin/env bash
# Put the checkpoint that run_on_device.sh packed into DEST (default configs/default-model).
#   bash tools/default_model/unpack_checkpoint.sh DIR_WITH_PARTS [DEST]
set -euo pipefail
parts="${1:?directory holding default-model.tar.part-*}"
dest="${2:-configs/default-model}"
mkdir -p "$dest"
cat "$parts"/default-model.tar.part-* | tar -xf - -C "$dest"
ls -la "$dest"
