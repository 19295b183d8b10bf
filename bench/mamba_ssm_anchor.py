"""mamba_ssm's Triton kernels (the anchors of the SSM benchmarks), imported without its CUDA extensions.

`MAMBA_SKIP_CUDA_BUILD=TRUE MAMBA_FORCE_BUILD=TRUE pip wheel mamba-ssm==2.3.2.post1 --no-deps
--no-build-isolation -w .whl` builds a pure-Python wheel. Its package `__init__` imports compiled
modules (selective_scan_cuda, causal_conv1d), so `load_mamba_triton` puts empty stand-ins for the
packages `mamba_ssm`, `mamba_ssm.ops` and `mamba_ssm.ops.triton` (with the real folders as their
paths) into sys.modules and imports only the Triton module files asked for. These need torch,
triton, einops and packaging.

Where the package comes from: an installed mamba_ssm if Python finds one (found, not imported), else
the newest `.whl/mamba_ssm-*.whl`, unpacked once into `.whl/unpacked/` (no pip needed). A missing
einops or packaging is taken the same way from `.whl/einops-*.whl` / `.whl/packaging-*.whl`.

    from bench.mamba_ssm_anchor import load_mamba_triton
    mamba_chunk_scan_combined = load_mamba_triton("ssd_combined").mamba_chunk_scan_combined
    selective_state_update = load_mamba_triton("selective_state_update").selective_state_update
"""

from __future__ import annotations

import glob
import importlib
import importlib.util
import os
import sys
import types
import zipfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WHEELS = os.path.join(ROOT, ".whl")


def _unpacked(wheel: str) -> str:
    """The folder holding the wheel's files (unpacked on first use)."""
    target = os.path.join(WHEELS, "unpacked", os.path.basename(wheel)[: -len(".whl")])
    if not os.path.isdir(target):
        partial = f"{target}.partial{os.getpid()}"
        with zipfile.ZipFile(wheel) as z:
            z.extractall(partial)
        os.replace(partial, target)
    return target


def _find_or_unpack(name: str, wheel_prefix: str) -> str | None:
    """Makes `name` importable (from a wheel in .whl/ if Python does not find it); returns the
    folder of the package, or None when there is neither."""
    spec = importlib.util.find_spec(name)  # a top-level package is found without being imported
    if spec is None:
        wheels = sorted(glob.glob(os.path.join(WHEELS, f"{wheel_prefix}-*.whl")))
        if not wheels:
            return None
        sys.path.insert(0, _unpacked(wheels[-1]))
        importlib.invalidate_caches()
        spec = importlib.util.find_spec(name)
    return None if spec is None or spec.submodule_search_locations is None else spec.submodule_search_locations[0]


def load_mamba_triton(module: str) -> types.ModuleType:
    """mamba_ssm.ops.triton.<module>, imported without running mamba_ssm's package __init__ files."""
    for dep in ("einops", "packaging"):
        if _find_or_unpack(dep, dep) is None:
            raise ImportError(f"mamba_ssm's Triton modules need {dep}: pip install {dep}, or put its wheel in .whl/")
    if "mamba_ssm" not in sys.modules:
        root = _find_or_unpack("mamba_ssm", "mamba_ssm")
        if root is None:
            raise ImportError("mamba_ssm not found: install it, or build its pure-Python wheel into .whl/ "
                              "(see bench/mamba_ssm_anchor.py)")
        for name, path in (("mamba_ssm", root), ("mamba_ssm.ops", os.path.join(root, "ops")),
                           ("mamba_ssm.ops.triton", os.path.join(root, "ops", "triton"))):
            package = types.ModuleType(name)
            package.__path__ = [path]
            sys.modules[name] = package
    return importlib.import_module(f"mamba_ssm.ops.triton.{module}")
