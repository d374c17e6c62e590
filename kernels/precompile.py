"""Compile (or only lower) every static configuration of every TileLang kernel.

    python -m kernels.precompile               # compile for sm_90 into tilelang's cache
    python -m kernels.precompile --lower-only  # lower to CUDA source only (fast, no nvcc)

Compiling needs nvcc but no GPU.  Kernels are compiled for the explicit
target {"kind": "cuda", "arch": "sm_90"} through the same function the
wrappers use at run time (`_tilelang.compiled_kernel`), so an H200 run with the
same ``TILELANG_CACHE_DIR`` loads them from the cache instead of compiling.
Set ``TILELANG_CACHE_DIR`` (e.g. to .cache/tilelang in the repo) to choose
where the cache lands; tilelang's default is ~/.tilelang/cache.
"""

import argparse
import os
import sys
import time

from . import _tilelang


def _configurations(kernel_filter: str | None):
    for name, kernel in _tilelang.kernel_defs().items():
        if kernel_filter is not None and kernel_filter not in name:
            continue
        for config in kernel.configs:
            yield name, kernel, config


def _lower(kernel, config) -> str:
    func = kernel.build(config)
    source = _tilelang.lower_to_cuda(func, _tilelang.SM90)
    if _tilelang.global_function_name(func) not in source:
        raise RuntimeError(f"{kernel.name} {config}: {_tilelang.global_function_name(func)} missing from the CUDA source")
    return f"{len(source)} chars of CUDA"


def _compile(kernel, config) -> str:
    compiled = _tilelang.compiled_kernel(kernel, config, _tilelang.SM90)
    return f"cache {getattr(compiled, '_tilelang_cache_path', None) or '(none)'}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kernels.precompile", description=__doc__.splitlines()[0])
    parser.add_argument("--lower-only", action="store_true", help="lower to CUDA source for sm_90 without compiling")
    parser.add_argument("--kernel", help="only kernels whose name contains this string")
    args = parser.parse_args(argv)

    action = _lower if args.lower_only else _compile
    verb = "lowered" if args.lower_only else "compiled"
    if not args.lower_only:
        print(f"TILELANG_CACHE_DIR={os.environ.get('TILELANG_CACHE_DIR', '(unset: ~/.tilelang/cache)')}", flush=True)
    total = time.perf_counter()
    count = 0
    for name, kernel, config in _configurations(args.kernel):
        start = time.perf_counter()
        detail = action(kernel, config)
        print(f"{verb} {name} {config} in {time.perf_counter() - start:.2f} s: {detail}", flush=True)
        count += 1
    print(f"{verb} {count} configurations in {time.perf_counter() - total:.2f} s", flush=True)
    return 0 if count else 1


if __name__ == "__main__":
    sys.exit(main())
