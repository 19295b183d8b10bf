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
# SGLang's frontend DSL (sgl.gen / select / fork, sgl.RuntimeEndpoint) for the server tests. Its
# runtime pins a CUDA torch, so install it without dependencies plus the light packages that
# `import sglang` and RuntimeEndpoint actually import (numpy, triton, tqdm, packaging, pydantic
# and starlette come with hybrid_sgl already).
pip install -q aiohttp ipython msgspec orjson pillow psutil pybase64 pyzmq requests
pip install -q --no-deps "sglang==0.5.23"
