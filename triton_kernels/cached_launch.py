"""Launch compiled Triton kernels without Triton's per-call Python path.

`kernel[grid](*args, **kw)` binds every argument, builds Triton's specialization list, hashes it, checks
the kernel's globals and builds launch metadata on each call: about half of an eager decode step's host
time (a cProfile of the 9B shape's eager step, bench/README.md). `cached_launch(kernel)` keeps, per call
site shape, the compiled kernel Triton chose the first time and calls its driver launcher directly.

The cache key is everything Triton specializes a compiled kernel on, or finer:
- tensors: dtype and whether the address is 16-byte aligned;
- ints: equal to 1, divisible by 16, and which integer type holds them (i32, i64, u64);
- constexpr parameters and every other argument by value (floats: by type only, as Triton);
- an autotuned kernel's key arguments by value (the autotuner picks its config from them);
- the current device.
A key seen before launches the same compiled kernel Triton itself would pick. Grids may be tuples or
callables of the constexpr parameters (`meta["BLOCK_N"]`), as every grid here is.

Not used in the interpreter (TRITON_INTERPRET=1: kernels are not compiled) nor while `ENABLED` is
False (HYBRID_SGL_CACHED_LAUNCH=0 at start turns it off); a fast launch calls no Triton launch hooks
(profilers such as proton see only the first call: turn it off to profile with them).
"""

from __future__ import annotations

import os

import torch
import triton
from triton.runtime.autotuner import Autotuner
from triton.runtime.jit import JITFunction

# on unless HYBRID_SGL_CACHED_LAUNCH=0 (the CUDA suite passed with it on; bench/step_profile.py times both ways)
ENABLED = os.environ.get("HYBRID_SGL_CACHED_LAUNCH", "1") != "0"
# the compiled C launch called without the launcher object's Python frame (~0.9 of its 6.3 us on an H100 host,
# bench/README.md): only for the Triton version whose launcher this matches; HYBRID_SGL_DIRECT_C_LAUNCH=0 turns it
# off (tests/gpu/test_cached_launch_cuda.py runs both ways)
DIRECT_C_LAUNCH = triton.__version__.startswith("3.6.") and os.environ.get("HYBRID_SGL_DIRECT_C_LAUNCH", "1") != "0"


def runtime_key(v):
    """The part of one runtime (non-constexpr) argument a compiled kernel depends on: for ints, whether
    it is 1, a multiple of 16, within int32, and past int64 (Triton's classes, or finer)."""
    if type(v) is int:
        return v == 1, v & 15 == 0, -0x80000000 <= v <= 0x7FFFFFFF, v >= 1 << 63
    if isinstance(v, torch.Tensor):
        return v.dtype, v.data_ptr() & 15 == 0
    if type(v) is float:
        return float
    return v  # None, bools, dtypes: by value


class _Compiled:
    """One compiled kernel and what its launches share: `meta`, every constexpr's value (passed positionally,
    by name, by default or by the autotuner's config: what a callable grid reads), and `tail`, the values of
    the parameters after the positional ones (None when a call passes a runtime one by name: read per call)."""

    __slots__ = ("launcher", "function", "packed_metadata", "tail", "tail_names", "meta", "direct", "flags")

    def __init__(self, compiled, tail_names: tuple[str, ...], meta: dict, runtime_kwargs: bool):
        self.launcher = compiled.run  # the driver's launcher (loads the module on first access)
        self.function = compiled.function
        self.packed_metadata = compiled.packed_metadata
        # Triton 3.6's launcher object only adds its scratch buffers (none for these kernels) and two flags
        # before it calls the compiled C launch: call that directly where the kernel needs no scratch
        run = self.launcher
        self.direct = getattr(run, "launch", None) is not None and not (
            getattr(run, "global_scratch_size", 1) or getattr(run, "profile_scratch_size", 1))
        self.flags = (run.launch_cooperative_grid, run.launch_pdl) if self.direct else ()
        self.tail_names, self.meta = tail_names, meta
        self.tail = None if runtime_kwargs else tuple(meta[name] for name in tail_names)


class CachedLaunch:
    """`cached_launch(kernel)[grid](*args, **kwargs)` launches as `kernel[grid](...)` does.

    kernel: a @triton.jit function, or a triton.autotune over one (with no config pre-hooks)."""

    def __init__(self, kernel):
        self.kernel = kernel
        jit = kernel.fn if isinstance(kernel, Autotuner) else kernel
        self.params = [(p.name, p.is_constexpr, p.default) for p in jit.params]
        self.names = [name for name, _, _ in self.params]
        self.constexpr_positions = frozenset(i for i, (_, c, _) in enumerate(self.params) if c)
        self.first_constexpr = min(self.constexpr_positions, default=len(self.params))
        self.runtime_names = frozenset(name for name, c, _ in self.params if not c)
        tuned = kernel.keys if isinstance(kernel, Autotuner) else ()
        self.tuned_positions = tuple(self.names.index(k) for k in tuned)
        self.compiled: dict = {}
        self._device = self._stream = None

    @property
    def fn(self):
        """The wrapped kernel, as an Autotuner's `fn` is (code that unwraps kernels follows `.fn`)."""
        return self.kernel

    def __getattr__(self, name):  # configs, keys ...: the kernel's own
        return getattr(self.kernel, name)

    def __getitem__(self, grid):
        return lambda *args, **kwargs: self.launch(grid, args, kwargs)

    def key(self, device: int, args: tuple, kwargs: dict) -> tuple:
        """Everything the compiled kernel Triton picks depends on (see the module's docstring)."""
        if len(args) <= self.first_constexpr:  # runtime_key of each, its two common cases inline (half the time)
            head = tuple([(v == 1, v & 15 == 0, -0x80000000 <= v <= 0x7FFFFFFF, v >= 1 << 63) if type(v) is int
                          else (v.dtype, v.data_ptr() & 15 == 0) if isinstance(v, torch.Tensor) else runtime_key(v)
                          for v in args])
        else:
            head = tuple(a if i in self.constexpr_positions else runtime_key(a) for i, a in enumerate(args))
        if self.runtime_names.isdisjoint(kwargs):
            kw = tuple(kwargs.items())
        else:
            kw = tuple((k, runtime_key(v) if k in self.runtime_names else v) for k, v in kwargs.items())
        if not self.tuned_positions:
            return device, head, kw
        tuned = tuple(args[i] if i < len(args) else kwargs.get(self.names[i]) for i in self.tuned_positions)
        return device, head, kw, tuned

    def launch(self, grid, args: tuple, kwargs: dict) -> None:
        if not ENABLED:
            self.kernel[grid](*args, **kwargs)
            return
        if self._device is None:  # CUDA is initialized by now: the device query without torch's lazy-init check
            from triton.runtime import driver
            self._device = torch._C._cuda_getDevice if torch.cuda.is_initialized() else driver.active.get_current_device
            self._stream = driver.active.get_current_stream
        device = self._device()
        key = self.key(device, args, kwargs)
        entry = self.compiled.get(key)
        if entry is None:
            self.compiled[key] = self._first_launch(grid, args, kwargs)
            return
        if callable(grid):
            grid = grid(entry.meta)
        n = len(grid)
        tail = entry.tail if entry.tail is not None else tuple(
            kwargs[k] if k in kwargs else entry.meta[k] for k in entry.tail_names)
        if entry.direct and DIRECT_C_LAUNCH:
            entry.launcher.launch(grid[0], grid[1] if n > 1 else 1, grid[2] if n > 2 else 1, self._stream(device),
                                  entry.function, *entry.flags, None, None, entry.packed_metadata, None, None, None,
                                  *args, *tail)
        else:
            entry.launcher(grid[0], grid[1] if n > 1 else 1, grid[2] if n > 2 else 1, self._stream(device),
                           entry.function, entry.packed_metadata, None, None, None, *args, *tail)

    def _first_launch(self, grid, args: tuple, kwargs: dict) -> _Compiled:
        """Triton's own launch; keeps the kernel it compiled or found."""
        compiled = self.kernel[grid](*args, **kwargs)
        config = {}
        if isinstance(self.kernel, Autotuner):
            assert self.kernel.best_config.pre_hook is None, "a config pre-hook runs on every launch"
            config = self.kernel.best_config.all_kwargs()
        meta = {name: a for i, (name, a) in enumerate(zip(self.names, args)) if i in self.constexpr_positions}
        for name, is_constexpr, default in self.params[len(args):]:
            if is_constexpr or name not in kwargs:
                meta[name] = kwargs.get(name, config.get(name, default))
        runtime_kwargs = any(k in self.runtime_names for k in kwargs)
        return _Compiled(compiled, tuple(self.names[len(args):]), meta, runtime_kwargs)


def cached_launch(kernel):
    """Wrap a kernel launched from the host; the kernel itself where Triton interprets (nothing compiled)."""
    jit = kernel.fn if isinstance(kernel, Autotuner) else kernel
    return CachedLaunch(kernel) if isinstance(jit, JITFunction) else kernel


