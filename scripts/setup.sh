#!/usr/bin/env bash
# Create .venv and install hybrid_sgl with its test tools on a fresh machine.
# torch goes first so that nothing else pulls a different (multi-GB CUDA) build of it.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m venv .venv
. .venv/bin/activate
pip install -q --upgrade pip
pip install -q "torch==2.13.0"
pip install -q -e ".[test]"
