"""Compile Triton kernels for Hopper (sm_90a) on a machine without a GPU and read ptxas's register and
spill report: Triton's CUDA backend and the ptxas it bundles run on CPU. Kernel tests use it to catch
what only the compiler sees (the interpreter runs the logic). It runs in a subprocess, since
TRITON_INTERPRET=1 (set by conftest on CPU) replaces @triton.jit functions with interpreted ones.

A test passes a script body that fills `out[name] = compile_sm90(kernel, types, constexprs,
num_warps, num_stages)` and prints `json.dumps(out)`; arguments not in `types` are i32."""

import json
import os
import subprocess
import sys

import pytest

SM90_PRELUDE = r'''
import json, re, subprocess, tempfile, warnings
warnings.filterwarnings("ignore")
import torch
import triton
from triton.backends.compiler import GPUTarget
from triton.backends.nvidia.compiler import get_ptxas
from triton.compiler import ASTSource
from triton.runtime.jit import JITFunction

def compile_sm90(kernel, types, constexprs, num_warps, num_stages, divisible=()):
    """(registers, spilled bytes) of kernel built for sm_90a; arguments not in types are i32. divisible: integer
    arguments that are multiples of 16 at the shapes served, which Triton specializes on at launch (it can then
    vectorize and pipeline loads masked by them)."""
    fn = kernel
    while not isinstance(fn, JITFunction):
        fn = fn.fn
    sig = {n: "constexpr" if n in constexprs else types.get(n, "i32") for n in fn.arg_names}
    aligned = [n for n in fn.arg_names if types.get(n, "").startswith("*") or n.startswith("stride") or n in divisible]
    attrs = {(fn.arg_names.index(n),): [["tt.divisibility", 16]] for n in aligned}
    ck = triton.compile(ASTSource(fn=fn, signature=sig, constexprs=constexprs, attrs=attrs),
                        target=GPUTarget("cuda", 90, 32), options=dict(num_warps=num_warps, num_stages=num_stages))
    with tempfile.NamedTemporaryFile("w", suffix=".ptx") as f:
        f.write(ck.asm["ptx"])
        f.flush()
        log = subprocess.run([get_ptxas(90).path, "--gpu-name", "sm_90a", "-v", f.name, "-o", "/dev/null"],
                             capture_output=True, text=True, check=True).stderr
    regs = int(re.search(r"Used (\d+) registers", log).group(1))
    return regs, sum(int(x) for x in re.findall(r"(\d+) bytes spill (?:stores|loads)", log))

out = {}
'''


def compile_sm90_in_subprocess(body: str) -> dict:
    """Runs SM90_PRELUDE + body without the interpreter (TRITON_INTERPRET=1, set by conftest on CPU,
    replaces @triton.jit functions) and returns the {name: (registers, spilled bytes)} it prints."""
    pytest.importorskip("triton.backends.nvidia.compiler")
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = root + os.pathsep + env.get("PYTHONPATH", "")
    env.setdefault("TRITON_DEFAULT_FP_FUSION", "1")
    run = subprocess.run([sys.executable, "-c", SM90_PRELUDE + body], env=env, cwd=root, capture_output=True,
                         text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-4000:]
    return json.loads(run.stdout.strip().splitlines()[-1])
