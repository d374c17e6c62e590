"""Every TileLang kernel, in every static configuration, lowers to CUDA for sm_90.

Needs tilelang but no GPU (lowering stops before nvcc), so it runs in CI.
Most configurations take a second or two on a 2-core machine, the casts 12-32 s.

Tuning candidates that no wrapper launches (`KernelDef.candidates`) are lowered
only with ``TKVERIFY_LOWER_CANDIDATES=1``: they were a third of this file's time in
CI, and every GPU run compiles them anyway (the plugin's background precompile,
``python -m kernels.precompile``) before its tests and tune step use them.
"""

import functools
import os

import pytest

from kernels import _tilelang

LOWER_CANDIDATES = os.environ.get("TKVERIFY_LOWER_CANDIDATES", "") not in ("", "0")
SKIP_CANDIDATE = pytest.mark.skipif(
    not LOWER_CANDIDATES, reason="a tuning candidate no wrapper launches: lowered with TKVERIFY_LOWER_CANDIDATES=1, "
                                 "compiled by every GPU run")


def _id(kernel, config) -> str:
    return f"{kernel.name}-{config}"


CONFIGS = [pytest.param((kernel, config), id=_id(kernel, config),
                        marks=[SKIP_CANDIDATE] if config in kernel.candidates else [])
           for kernel in _tilelang.kernel_defs().values() for config in kernel.configs]


@pytest.fixture(scope="module")
def tilelang():
    try:
        import tilelang
    except Exception as error:  # ImportError, or a broken native library
        pytest.skip(f"tilelang cannot be imported: {error!r}")
    return tilelang


@functools.lru_cache(maxsize=None)
def cuda_source(kernel, config) -> tuple[str, str]:
    """(global function name, CUDA source for sm_90) of one configuration."""
    func = kernel.build(config)
    return _tilelang.global_function_name(func), _tilelang.lower_to_cuda(func, _tilelang.SM90)


@pytest.mark.parametrize("case", CONFIGS)
def test_lowers_to_cuda_for_sm90(tilelang, case):
    kernel, config = case
    name, source = cuda_source(kernel, config)
    assert "__global__ void __launch_bounds__" in source
    assert f" {name}(" in source, f"{name} not found in the CUDA source of {kernel.name} {config}"


def test_vectorized_transposes_use_16_byte_accesses(tilelang):
    """Vectorization failing is only a warning in tilelang; catch it here."""
    from kernels import transpose

    for config in transpose.STATIC_CONFIGS:
        if not config.vectorized:
            continue
        _, source = cuda_source(transpose.BATCHED_TRANSPOSE, config)
        loads_and_stores = source.count("*(int4*)") + source.count("*(uint4*)")
        # one global load, one shared store, one register read, one global store
        assert loads_and_stores >= 4, f"{config}: expected 16-byte vector accesses in\n{source}"


def test_transpose_candidates_move_blocks_with_16_byte_stores(tilelang):
    """The tuning candidates store through tk_transpose_block's spelled-out st.global.v4 (nvcc splits
    plain 16-byte stores of those registers); the base kernels do not use it."""
    from kernels import transpose

    for config in transpose.TRANSPOSE_TUNE_CONFIGS:
        if config in transpose.BATCHED_TRANSPOSE.candidates and not LOWER_CANDIDATES:
            continue  # lowered on request only, as test_lowers_to_cuda_for_sm90's candidates
        _, source = cuda_source(transpose.BATCHED_TRANSPOSE, config)
        width = transpose.WIDTH_OF[config.dtype]
        assert f"{transpose.TRANSPOSE_BLOCK}<{width}, {config.read_bytes}>(" in source, config
        assert "st.global.v4.u32" in source, config
    for config in transpose.STATIC_CONFIGS:
        _, source = cuda_source(transpose.BATCHED_TRANSPOSE, config)
        assert transpose.TRANSPOSE_BLOCK not in source, config


def test_every_configuration_a_wrapper_launches_is_lowered_in_ci():
    """A shipped candidate (a *_SHIPPED table's value) is launched, so it is no skippable candidate; the base
    configuration it replaces is launched only when a tuning run's override puts it back: a candidate."""
    from kernels import engram, moe, transpose

    for kernel, shipped in ((engram.GATE_FWD, engram.FWD_SHIPPED), (engram.GATE_BWD, engram.BWD_SHIPPED),
                            (moe.EXPAND_TO_FUSED, moe.EXPAND_SHIPPED),
                            (transpose.BATCHED_TRANSPOSE, transpose.TRANSPOSE_SHIPPED)):
        for base, launched in shipped.items():
            assert base in kernel.configs and launched in kernel.configs, (kernel.name, launched)
            assert launched not in kernel.candidates, (kernel.name, launched)
            assert base == launched or base in kernel.candidates, (kernel.name, base)
    with pytest.raises(ValueError, match="candidates not among its configs"):
        _tilelang.KernelDef("toy", lambda config: None, (1, 2), candidates=(3,))


def test_registry_lists_each_kernel_once():
    names = [kernel.name for kernel in _tilelang.kernel_defs().values()]
    assert sorted(names) == sorted(set(names)) == sorted(_tilelang.kernel_defs())


WAIT_FOR_LOCK = """
import sys, time
import tilelang.env
from kernels import _tilelang
print("ready", flush=True)
start = time.perf_counter()
with _tilelang._compile_lock(sys.argv[1], sys.argv[2], "sm_90"):
    print(f"{time.perf_counter() - start:.3f}")
"""


@pytest.mark.parametrize("other_config, waits", [("same", True), ("other", False)])
def test_a_configuration_compiles_in_one_process_while_others_wait(tilelang, tmp_path, monkeypatch, other_config,
                                                                   waits):
    """xdist workers of a cold run: the second to need a configuration waits for the first's
    compile (then loads it from the disk cache); another configuration does not wait."""
    import subprocess
    import sys
    import time
    from pathlib import Path

    monkeypatch.setenv("TILELANG_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(tilelang.env, "TILELANG_CACHE_DIR", str(tmp_path))
    root = Path(__file__).resolve().parent.parent
    with _tilelang._compile_lock("toy.kernel", "same", "sm_90"):
        waiter = subprocess.Popen([sys.executable, "-c", WAIT_FOR_LOCK, "toy.kernel", other_config], cwd=root,
                                  stdout=subprocess.PIPE, text=True)
        assert waiter.stdout.readline().strip() == "ready"
        time.sleep(1.5)
    waited = float(waiter.stdout.read())  # not communicate(timeout=...): it reads past readline's buffer
    assert waiter.wait(timeout=60) == 0
    assert (waited > 0.5) == waits, f"the other process waited {waited:.3f} s for the lock"
