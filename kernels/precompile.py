"""Compile (or only lower) every static configuration of every TileLang kernel.

    python -m kernels.precompile               # compile for sm_90 into tilelang's cache
    python -m kernels.precompile --jobs 8      # the same, 8 configurations at a time
    python -m kernels.precompile --lower-only  # lower to CUDA source only (fast, no nvcc)
    python -m kernels.precompile --lower-only --digests new.json --compare old.json
                                               # sha256 of each configuration's CUDA, against an earlier list

``--digests`` and ``--compare`` check that a change which should not touch the kernels (a refactor, a
module split) lowers every configuration to byte-identical CUDA: write the digests before the change,
compare after it (exit status 1 when a configuration's CUDA differs or is missing).

Compiling needs nvcc but no GPU.  Kernels are compiled for the explicit
target {"kind": "cuda", "arch": "sm_90"} through the same function the
wrappers use at run time (`_tilelang.compiled_kernel`), so an H200 run with the
same ``TILELANG_CACHE_DIR`` loads them from the cache instead of compiling.
Set ``TILELANG_CACHE_DIR`` (e.g. to .cache/tilelang in the repo) to choose
where the cache lands; tilelang's default is ~/.tilelang/cache.

Each configuration compiles under `_tilelang`'s per-configuration lock, so this
can run beside a test session that needs the same kernels (the pytest plugin's
``--tk-precompile``): whichever process comes first compiles, the other loads.
"""

import argparse
import concurrent.futures
import hashlib
import json
import multiprocessing
import os
import sys
import time
from pathlib import Path

import torch

from . import _tilelang


def _configurations(kernel_filter: str | None):
    """(kernel name, index of the config, config): the index is what a worker process is sent."""
    for name, kernel in _tilelang.kernel_defs().items():
        if kernel_filter is not None and kernel_filter not in name:
            continue
        for index, config in enumerate(kernel.configs):
            yield name, index, config


def _lower(kernel, config) -> str:
    func = kernel.build(config)
    source = _tilelang.lower_to_cuda(func, _tilelang.SM90)
    if _tilelang.global_function_name(func) not in source:
        raise RuntimeError(f"{kernel.name} {config}: {_tilelang.global_function_name(func)} missing from the CUDA source")
    return hashlib.sha256(source.encode()).hexdigest()


def _compile(kernel, config, arch: str = "sm_90") -> str:
    compiled = _tilelang.compiled_kernel(kernel, config, _tilelang.cuda_target(arch))
    return f"cache {getattr(compiled, '_tilelang_cache_path', None) or '(none)'}"


def _run_one(action_name: str, name: str, index: int, arch: str) -> tuple[str, float]:
    """One configuration, by kernel name and index (what a worker process can be sent)."""
    kernel = _tilelang.kernel_defs()[name]
    start = time.perf_counter()
    config = kernel.configs[index]
    detail = _lower(kernel, config) if action_name == "lower" else _compile(kernel, config, arch)
    return detail, time.perf_counter() - start


def _results(work: list, action: str, arch: str, jobs: int):
    """(work item, (detail, seconds)) for each item: in order in this process, or as they finish in `jobs`
    spawned ones (not forked: each imports tilelang afresh rather than inheriting a half-used one)."""
    if jobs <= 1:
        yield from ((item, _run_one(action, item[0], item[1], arch)) for item in work)
        return
    with concurrent.futures.ProcessPoolExecutor(jobs, mp_context=multiprocessing.get_context("spawn")) as pool:
        futures = {pool.submit(_run_one, action, name, index, arch): (name, index, config)
                   for name, index, config in work}
        for future in concurrent.futures.as_completed(futures):
            yield futures[future], future.result()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kernels.precompile", description=__doc__.splitlines()[0])
    parser.add_argument("--lower-only", action="store_true", help="lower to CUDA source for sm_90 without compiling")
    parser.add_argument("--kernel", help="only kernels whose name contains this string")
    parser.add_argument("--jobs", type=int, default=1, help="configurations compiled at a time (processes)")
    parser.add_argument("--arch", default="sm_90",
                        help="the CUDA arch to compile for, or 'device' for this machine's first GPU")
    parser.add_argument("--digests", type=Path, metavar="JSON",
                        help="with --lower-only: write {kernel: {config: sha256 of its CUDA}} here")
    parser.add_argument("--compare", type=Path, metavar="JSON",
                        help="with --lower-only: compare the digests with this earlier --digests file")
    args = parser.parse_args(argv)
    if (args.digests or args.compare) and not args.lower_only:
        parser.error("--digests and --compare need --lower-only")
    arch = _tilelang.target_for(torch.device("cuda", 0))["arch"] if args.arch == "device" else args.arch

    action = "lower" if args.lower_only else "compile"
    verb = "lowered" if args.lower_only else "compiled"
    if not args.lower_only:
        print(f"TILELANG_CACHE_DIR={os.environ.get('TILELANG_CACHE_DIR', '(unset: ~/.tilelang/cache)')}, "
              f"arch {arch}", flush=True)
    work = list(_configurations(args.kernel))
    total = time.perf_counter()
    digests: dict[str, dict[str, str]] = {}
    for (name, _, config), (detail, seconds) in _results(work, action, arch, args.jobs):
        if args.lower_only:
            digests.setdefault(name, {})[repr(config)] = detail
            detail = f"sha256 {detail}"
        print(f"{verb} {name} {config} in {seconds:.2f} s: {detail}", flush=True)
    print(f"{verb} {len(work)} configurations in {time.perf_counter() - total:.2f} s", flush=True)
    if args.digests:
        args.digests.write_text(json.dumps(digests, indent=1, sort_keys=True) + "\n")
    if args.compare and not _same_digests(json.loads(args.compare.read_text()), digests):
        return 1
    return 0 if work else 1


def _same_digests(old: dict[str, dict[str, str]], new: dict[str, dict[str, str]]) -> bool:
    """Print each configuration of `new` whose CUDA differs from `old`'s or is new, and each of `old`'s
    kernels in `new` that lost a configuration; True when there is none."""
    changed = [f"differs: {k} {c}" if c in old.get(k, {}) else f"new: {k} {c}"
               for k, configs in new.items() for c, h in configs.items() if old.get(k, {}).get(c) != h]
    missing = [f"missing: {k} {c}" for k in new for c in old.get(k, {}) if c not in new[k]]
    for line in changed + missing:
        print(line)
    compared = sum(len(configs) for configs in new.values())
    print(f"{compared} configurations compared with the earlier digests: {len(changed)} differ or are new, "
          f"{len(missing)} missing")
    return not changed and not missing


if __name__ == "__main__":
    sys.exit(main())
