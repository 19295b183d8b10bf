"""The cached Triton launcher's bookkeeping on the CPU: which calls reuse a compiled kernel, and the argument
list and grid its launcher gets. Triton's own launch is replaced by a recorder (nothing compiles here); the
CUDA test (tests/gpu/test_cached_launch_cuda.py) launches real kernels both ways."""

import pytest
import torch
import triton
import triton.language as tl
from triton.runtime.jit import JITFunction

from triton_kernels import cached_launch as cl


@pytest.fixture(autouse=True)
def _enabled(monkeypatch):
    monkeypatch.setattr(cl, "ENABLED", True)


def _kernel(x, y, n, eps, FLAG: tl.constexpr, BLOCK: tl.constexpr = 16):
    pass


class _Compiled:
    """What Triton's launch returns: the launcher's handles; records each direct launch."""

    function, packed_metadata = "function", "packed"

    def __init__(self):
        self.launches = []

    @property
    def run(self):
        return lambda *a: self.launches.append(a)


def _recorded(kernel, tuned_config=None):
    """kernel's Triton launches recorded in .slow; each returns a fresh _Compiled (in .compiled)."""
    kernel.slow, kernel.compiled = [], []

    def run(*args, grid, warmup, **kwargs):
        kernel.slow.append((grid, args, kwargs))
        if tuned_config is not None:
            kernel.best_config = tuned_config
        kernel.compiled.append(_Compiled())
        return kernel.compiled[-1]
    kernel.run = run
    launcher = cl.CachedLaunch(kernel)
    launcher._device, launcher._stream = (lambda: 0), (lambda device: 7)
    return launcher


def test_a_second_call_of_the_same_specialization_launches_directly():
    jit = JITFunction(_kernel)
    launch = _recorded(jit)
    x, y = torch.zeros(64), torch.zeros(64)
    launch[(3,)](x, y, 5, 1e-6, FLAG=True)
    assert len(jit.slow) == 1 and jit.compiled[0].launches == []
    x2, y2 = torch.ones(64), torch.ones(64)
    launch[(4, 2)](x2, y2, 7, 1e-5, FLAG=True)  # other aligned tensors, another int of the same class, eps
    assert len(jit.slow) == 1
    (args,) = jit.compiled[0].launches
    assert args[:9] == (4, 2, 1, 7, "function", "packed", None, None, None)
    assert args[9:11] == (x2, y2) and args[11:] == (7, 1e-5, True, 16)  # the default BLOCK in its place
    launch[lambda meta: (meta["BLOCK"] * 2,)](x2, y2, 9, 1e-5, FLAG=True)  # a callable grid reads the constexprs
    assert jit.compiled[0].launches[-1][:3] == (32, 1, 1)


def test_what_triton_specializes_on_compiles_anew():
    jit = JITFunction(_kernel)
    launch = _recorded(jit)
    x, y = torch.zeros(64), torch.zeros(64)
    calls = [
        (x, y, 5, 1e-6, dict(FLAG=True)),
        (x, y, 5, 1e-6, dict(FLAG=False)),  # a constexpr
        (x, y, 5, 1e-6, dict(FLAG=True, BLOCK=32)),  # a constexpr given where its default was
        (x, y, 1, 1e-6, dict(FLAG=True)),  # an int equal to 1
        (x, y, 32, 1e-6, dict(FLAG=True)),  # a multiple of 16
        (x, y, 1 << 40, 1e-6, dict(FLAG=True)),  # past int32
        (x[1:], y, 5, 1e-6, dict(FLAG=True)),  # an address not 16-byte aligned
        (x.double(), y, 5, 1e-6, dict(FLAG=True)),  # a dtype
        (x, y, 5, 1e-6, dict(FLAG=True, num_warps=8)),  # a launch option
    ]
    for i, (a, b, n, eps, kw) in enumerate(calls):
        launch[(1,)](a, b, n, eps, **kw)
        assert len(jit.slow) == i + 1, calls[i]
    for a, b, n, eps, kw in calls:  # each again: all cached now
        launch[(1,)](a, b, n + 2 if n == 5 else n, eps, **kw)
    assert len(jit.slow) == len(calls)
    assert sum(len(c.launches) for c in jit.compiled) == len(calls)
    assert jit.compiled[2].launches[0][-2:] == (True, 32)


def test_runtime_arguments_passed_by_name_are_read_each_call():
    jit = JITFunction(_kernel)
    launch = _recorded(jit)
    x, y = torch.zeros(64), torch.zeros(64)
    launch[(1,)](x, y, n=5, eps=1e-6, FLAG=True)
    launch[(1,)](x, y, n=9, eps=2e-6, FLAG=True)
    (args,) = jit.compiled[0].launches
    assert args[9:] == (x, y, 9, 2e-6, True, 16)


def test_an_autotuned_kernel_keys_on_its_tuning_arguments_and_launches_its_config():
    jit = JITFunction(_kernel)
    tuned = triton.autotune(configs=[triton.Config({"BLOCK": 64}), triton.Config({"BLOCK": 128})], key=["n"])(jit)
    launch = _recorded(tuned, tuned_config=triton.Config({"BLOCK": 64}, num_warps=2))
    x, y = torch.zeros(64), torch.zeros(64)
    launch[lambda meta: (meta["BLOCK"],)](x, y, 5, 1e-6, FLAG=True)
    launch[lambda meta: (meta["BLOCK"],)](x, y, 7, 1e-6, FLAG=True)  # another tuning key: the tuner decides
    assert len(tuned.slow) == 2
    launch[lambda meta: (meta["BLOCK"],)](x, y, 7, 3e-6, FLAG=True)
    (args,) = tuned.compiled[1].launches
    assert args[0] == 64 and args[9:] == (x, y, 7, 3e-6, True, 64)


def test_disabled_every_launch_is_tritons(monkeypatch):
    jit = JITFunction(_kernel)
    launch = _recorded(jit)
    monkeypatch.setattr(cl, "ENABLED", False)
    x, y = torch.zeros(64), torch.zeros(64)
    for _ in range(3):
        launch[(1,)](x, y, 5, 1e-6, FLAG=True)
    assert len(jit.slow) == 3 and not launch.compiled


def test_interpreted_kernels_are_not_wrapped():
    interpreted = triton.runtime.interpreter.InterpretedFunction(_kernel)
    assert cl.cached_launch(interpreted) is interpreted
    assert isinstance(cl.cached_launch(JITFunction(_kernel)), cl.CachedLaunch)


def test_constexprs_passed_by_position_key_by_value():
    jit = JITFunction(_kernel)
    launch = _recorded(jit)
    x, y = torch.zeros(64), torch.zeros(64)
    for flag, block in [(True, 16), (False, 16), (False, 32), (True, 16), (False, 32)]:
        launch[lambda meta: (meta["BLOCK"], meta["FLAG"])](x, y, 5, 1e-6, flag, block)
    assert len(jit.slow) == 3
    assert [c.launches[0][:2] for c in jit.compiled if c.launches] == [(16, True), (32, False)]
