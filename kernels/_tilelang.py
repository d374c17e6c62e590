"""Plumbing shared by the TileLang kernels.

- `tl()` / `T()`: tilelang and tilelang.language, imported on first use only.
- `KernelDef` and `kernel_defs()`: the registry of kernels and their static
  configurations (names listed in `kernels.KERNELS`).
- Targets: `cuda_target(arch)` builds every target dict; `target_for(device)`
  for running, `SM90` for lowering and precompiling.  A kernel compiled here for `SM90` lands in tilelang's disk
  cache (``TILELANG_CACHE_DIR``) under a key that includes the target dict, so
  the run-time target must be the same dict for the cache to be hit.
- `compiled_kernel`: an in-process cache of compiled kernels per
  (kernel, static config, arch); across processes (xdist workers) a lock file
  per configuration lets one of them compile it and the others load it.
- `lower_to_cuda`: CUDA source for one configuration, without a GPU.
- `launches`: a process-local recorder of the (kernel, static config) each wrapper asks
  `compiled_kernel` for, read around one implementation call (kernel-path coverage).
- Argument checks that raise TypeError / ValueError naming the argument.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import functools
import hashlib
import importlib
import operator
import os
import threading
from collections.abc import Callable, Hashable
from typing import Any

import torch

def cuda_target(arch: str) -> dict[str, str]:
    """The tilelang target dict for a CUDA arch.  Built here only: it is part of tilelang's disk-cache key,
    so precompiling and running must build it identically for the cache to be hit."""
    return {"kind": "cuda", "arch": arch}


SM90 = cuda_target("sm_90")

# Dimensions are bound to int32 symbolic sizes inside the kernels, and tile
# arithmetic rounds them up to a whole tile: keep that headroom below 2**31.
MAX_DIM = 2**31 - 2**10


def tl():
    """The tilelang module, imported on first use."""
    import tilelang

    return tilelang


def T():
    """tilelang.language (the kernel DSL), imported on first use."""
    import tilelang.language

    return tilelang.language


# ---------------------------------------------------------------- registry


@dataclasses.dataclass(frozen=True)
class KernelDef:
    """One TileLang kernel: how to build its prim_func for one static config.

    ``configs`` lists every static configuration the wrappers may ask for;
    each config is a hashable value (a NamedTuple) passed to ``build``.
    Everything else (token counts, matrix sizes, k) is a symbolic size, so it
    never causes a recompile.
    """

    name: str
    build: Callable[[Any], Any]
    configs: tuple[Hashable, ...]
    # Among `configs`, the tuning candidates that no wrapper launches as committed (benchmarks.tune and
    # the GPU tests try them; a *_OVERRIDES entry would launch one).  CI lowers them on request only.
    candidates: tuple[Hashable, ...] = ()

    def __post_init__(self):
        strays = [c for c in self.candidates if c not in self.configs]
        if strays:
            raise ValueError(f"{self.name}: candidates not among its configs: {strays}")


def tuning_only(candidates: tuple[Hashable, ...], *shipped: dict) -> tuple[Hashable, ...]:
    """What no wrapper launches as committed: the candidates that no *_SHIPPED table puts in place of a base
    configuration, and the base configurations a table replaces (`chosen_config` launches one only when a
    tuning run's override puts it back)."""
    launched = {c for table in shipped for c in table.values()}
    replaced = [base for table in shipped for base, c in table.items() if c != base and base not in launched]
    return tuple(dict.fromkeys([*(c for c in candidates if c not in launched), *replaced]))


def kernel_defs() -> dict[str, KernelDef]:
    """Every kernel listed in `kernels.KERNELS`, by name (imports their modules)."""
    from . import KERNELS

    defs = {}
    for name, path in KERNELS.items():
        module, _, attribute = path.partition(":")
        defs[name] = getattr(importlib.import_module(module), attribute)
    return defs


# ----------------------------------------------------------------- targets


def target_for(device: torch.device) -> dict[str, str]:
    """The tilelang target for a CUDA device, e.g. {"kind": "cuda", "arch": "sm_90"}."""
    return cuda_target(_arch(device.index if device.index is not None else torch.cuda.current_device()))


@functools.lru_cache(maxsize=None)
def _arch(index: int) -> str:
    # asked once per device: the query costs microseconds on every launch otherwise
    major, minor = torch.cuda.get_device_capability(index)
    return f"sm_{major}{minor}"


def pass_configs_of(func) -> dict[str, Any]:
    """The pass configs a prim_func carries (set with T.annotate_pass_configs)."""
    attrs = func.attrs
    if attrs is not None and "tilelang_pass_configs" in attrs:
        return dict(attrs["tilelang_pass_configs"])
    return {}


# One 16-byte store with st.global.cs (evict-first: data written once and not read again should not
# push out of L2 what other CTAs still read). The kernels that offer it as a tuning knob put this in
# their prelude and call STORE16_STREAM(dst, src) through T.call_extern; both addresses 16-byte aligned.
STORE16_STREAM = "tk_store16_stream"
STORE16_STREAM_PRELUDE = r"""
#ifndef TK_STORE16_STREAM
#define TK_STORE16_STREAM
__device__ __forceinline__ void tk_store16_stream(void* dst, const void* src) {
  uint4 v = *(const uint4*)src;
#if defined(__CUDA_ARCH__)
  asm volatile("st.global.cs.v4.u32 [%0], {%1, %2, %3, %4};"
               :: "l"(dst), "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w) : "memory");
#else
  *(uint4*)dst = v;
#endif
}
#endif
"""


# One 16-byte load that asks L2 to keep the line (evict_last) and one 16-byte store that asks L2 to let it
# go first (evict_first), through createpolicy cache hints.  For a kernel that reads each source row
# several times within a short window and writes every output byte once: the hints keep the sources in L2
# for their later reads instead of the writes pushing them out (expand_to_fused's gather).  Called as
# LOAD16_KEEP(dst, src) / STORE16_PASS(dst, src) through T.call_extern, both addresses 16-byte aligned.
LOAD16_KEEP = "tk_load16_keep"
STORE16_PASS = "tk_store16_pass"
L2_HINTS_PRELUDE = r"""
#ifndef TK_L2_HINTS
#define TK_L2_HINTS
__device__ __forceinline__ void tk_load16_keep(void* dst, const void* src) {
#if defined(__CUDA_ARCH__)
  uint4 v;
  unsigned long long policy;
  asm("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;" : "=l"(policy));
  asm volatile("ld.global.L2::cache_hint.v4.u32 {%0, %1, %2, %3}, [%4], %5;"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(src), "l"(policy));
  *(uint4*)dst = v;
#else
  *(uint4*)dst = *(const uint4*)src;
#endif
}
__device__ __forceinline__ void tk_store16_pass(void* dst, const void* src) {
  uint4 v = *(const uint4*)src;
#if defined(__CUDA_ARCH__)
  unsigned long long policy;
  asm("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(policy));
  asm volatile("st.global.L2::cache_hint.v4.u32 [%0], {%1, %2, %3, %4}, %5;"
               :: "l"(dst), "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w), "l"(policy) : "memory");
#else
  *(uint4*)dst = v;
#endif
}
#endif
"""


def chosen_config(base: Hashable, shipped: dict, overrides: dict,
                  fits: Callable[[Any], bool] = lambda config: True) -> Hashable:
    """The static configuration a wrapper launches for its `base` one: a tuning run's override
    (overrides[base]) where it fits the call, else the candidate the kernel ships (shipped[base]), else
    `base`.  Both tables are keyed by the base configuration, so a tuning run can also put the base
    kernel back in place of a shipped candidate."""
    override = overrides.get(base)
    if override is not None and fits(override):
        return override
    return shipped.get(base, base)


def lower_to_cuda(func, target: dict[str, str] = SM90) -> str:
    """CUDA source of a prim_func for `target`; needs no GPU.

    Lowering uses the same pass configs the JIT compile applies, so the source
    is the one that would be compiled.
    """
    tilelang = tl()
    tvm = tilelang.tvm
    with tvm.transform.PassContext(opt_level=3, config=pass_configs_of(func)), tvm.target.Target(target):
        return tilelang.lower(func, target=target).kernel_source


def global_function_name(func) -> str:
    """Name of the __global__ function tilelang generates for a prim_func."""
    return f"{func.attrs['global_symbol']}_kernel"


def _compile(kernel: KernelDef, config: Hashable, arch: str):
    func = kernel.build(config)
    with _compile_lock(kernel.name, config, arch):
        return tl().compile(func, target=cuda_target(arch))


@contextlib.contextmanager
def _compile_lock(name: str, config: Hashable, arch: str):
    """Hold a lock file per (kernel, config, arch) in tilelang's cache directory.

    pytest-xdist workers of a cold run need the same configurations at about the
    same time; tilelang's disk cache is safe under concurrent writers but lets each
    of them compile (seconds of nvcc apiece).  Under this lock the first worker
    compiles and the others wait, then load its entry from the disk cache.
    """
    from tilelang import env

    folder = os.path.join(env.TILELANG_CACHE_DIR, "tkverify-compile-locks")
    os.makedirs(folder, exist_ok=True)
    digest = hashlib.sha1(repr((name, config, arch)).encode()).hexdigest()[:20]
    with open(os.path.join(folder, f"{name}-{digest}.lock"), "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def compiled_kernel(kernel: KernelDef, config: Hashable, target: dict[str, str]):
    """The compiled kernel for (kernel, config, target), compiled at most once per process.

    tilelang's own disk cache makes the first call of a process cheap when
    the configuration was precompiled (``python -m kernels.precompile``).
    """
    key = (kernel.name, config, target.get("arch"))
    if _LISTENERS:
        _note_launch(kernel.name, config)
    compiled = _COMPILED.get(key)
    if compiled is not None and target.get("kind") == "cuda":
        return compiled
    if config not in kernel.configs:
        raise ValueError(f"{kernel.name}: {config!r} is not one of its static configurations")
    if target.get("kind") != "cuda" or set(target) != {"kind", "arch"}:
        raise ValueError(f"target must be {{'kind': 'cuda', 'arch': 'sm_XY'}}, got {target!r}")
    compiled = _COMPILED[key] = _compile(kernel, config, target["arch"])
    return compiled


# (kernel name, config, arch) -> compiled kernel: compiled once per process, and looked up on
# the launch path without hashing the KernelDef (all its configurations) on every call.
_COMPILED: dict[tuple[str, Hashable, str | None], Any] = {}


# ------------------------------------------------------- launch recorder

# The lists of the `launches()` blocks now open, each getting every (kernel name, config) that
# `compiled_kernel` is asked for.  Empty when nobody listens: the launch path then costs one test.
_LISTENERS: list[list[tuple[str, Hashable]]] = []
_LISTENERS_LOCK = threading.Lock()


def _note_launch(name: str, config: Hashable) -> None:
    with _LISTENERS_LOCK:
        for heard in _LISTENERS:
            heard.append((name, config))


@contextlib.contextmanager
def launches():
    """Record, inside the block, the (kernel name, static config) of every compiled kernel a wrapper asks
    for (what it launches: the wrappers ask right before each launch); yields the list, which fills as
    the block runs.  Blocks may nest or run in several threads at once: each hears every launch of the
    process while it is open."""
    heard: list[tuple[str, Hashable]] = []
    with _LISTENERS_LOCK:
        _LISTENERS.append(heard)
    try:
        yield heard
    finally:
        with _LISTENERS_LOCK:  # by identity: two listeners may hold equal lists
            del _LISTENERS[next(i for i, other in enumerate(_LISTENERS) if other is heard)]


def kernel_for(kernel: KernelDef, config: Hashable, device: torch.device):
    """The compiled kernel of (kernel, config) for the CUDA device `device`."""
    return compiled_kernel(kernel, config, target_for(device))


# Grids are 1-D with at most 2^31 - 1 CTAs: longer launches go in pieces.
MAX_BLOCKS_PER_LAUNCH = 2**31 - 1


def launch_in_pieces(kernel, total_blocks: int, *args) -> None:
    """Call `kernel(*args, num_blocks, block_offset)` over logical blocks [0, total_blocks)."""
    for offset in range(0, total_blocks, MAX_BLOCKS_PER_LAUNCH):
        kernel(*args, min(MAX_BLOCKS_PER_LAUNCH, total_blocks - offset), offset)


def aligned(t: torch.Tensor, nbytes: int = 16) -> torch.Tensor:
    """t itself, or a copy where its data does not start on an `nbytes` boundary (a view at an odd
    offset): the kernels' vector loads need the aligned start."""
    return t if t.data_ptr() % nbytes == 0 else t.clone()


def require_cuda(name: str, t: torch.Tensor) -> None:
    """After the eager checks (which put every tensor on `name`'s device): the kernels run on CUDA only."""
    if t.device.type != "cuda":
        raise ValueError(f"{name} must be on a CUDA device, got {t.device}")


def device_guard(device: torch.device):
    """Make `device` current for a launch; a no-op when it already is (the common case, and
    entering torch.cuda.device costs two driver calls)."""
    if device.type != "cuda" or device.index is None or device.index == torch.cuda.current_device():
        return contextlib.nullcontext()
    return torch.cuda.device(device)


@functools.lru_cache(maxsize=None)
def placeholder(dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A one-element stand-in for a buffer argument a kernel does not touch in this call (a new zero tensor
    each call: one cached per device could come from a CUDA graph's private pool when first made during a
    capture, and outlive it)."""
    return torch.zeros(1, dtype=dtype, device=device)


# ------------------------------------------------------- argument checks


def check_tensor(
    name: str,
    value: Any,
    *,
    dtypes: tuple[torch.dtype, ...] | None = None,
    ndim: int | None = None,
) -> torch.Tensor:
    """Check that `value` is a contiguous CUDA tensor of one of `dtypes` with `ndim` dims.

    Raises TypeError for a non-tensor or a wrong dtype, ValueError for a wrong
    number of dimensions, a non-CUDA device or a non-contiguous layout.
    """
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(value).__name__}")
    if dtypes is not None and value.dtype not in dtypes:
        allowed = ", ".join(str(d) for d in dtypes)
        raise TypeError(f"{name} must have dtype {allowed}, got {value.dtype}")
    if ndim is not None and value.dim() != ndim:
        raise ValueError(f"{name} must be {ndim}-D, got shape {tuple(value.shape)}")
    require_cuda(name, value)
    if not value.is_contiguous():
        raise ValueError(f"{name} must be contiguous, got strides {value.stride()} for shape {tuple(value.shape)}")
    return value


def check_int(name: str, value: Any, low: int, high: int) -> int:
    """Check that `value` is an integer (not a bool) in [low, high]; return it as int."""
    if isinstance(value, bool):
        raise TypeError(f"{name} must be an integer, got bool")
    try:
        value = operator.index(value)
    except TypeError:
        raise TypeError(f"{name} must be an integer, got {type(value).__name__}") from None
    if not low <= value <= high:
        raise ValueError(f"{name} must be in [{low}, {high}], got {value}")
    return value


def check_dims_fit_int32(name: str, tensor: torch.Tensor) -> None:
    """Kernels bind each dimension to an int32 symbolic size; reject larger ones."""
    if any(size > MAX_DIM for size in tensor.shape):
        raise ValueError(f"{name}: every dimension must be at most {MAX_DIM}, got shape {tuple(tensor.shape)}")
