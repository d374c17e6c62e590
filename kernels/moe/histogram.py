"""group_count: how many routing entries name each group, as a histogram.

Blocks of 256 threads take 2048 consecutive entries each (8 independent loads
per thread), count them into a shared histogram with integer atomics, and add
the non-zero bins to the zero-initialised global counts with integer atomics.
Integer addition is associative, so the result does not depend on the order
the atomics land in.  Entries are compared in their own width (an int64 entry
of 2**32 + 3 is not group 3).  Static configuration: the idx dtype.
"""

# No `from __future__ import annotations` here: tilelang evaluates the
# prim_func parameter annotations, which name the builders' local symbolic sizes.
from typing import NamedTuple

import torch

from kernels.torch import moe as eager  # the argument checks are the eager module's

from .. import _tilelang
from .._tilelang import KernelDef
from .common import MAX_EXPERTS, PASS_CONFIGS

GROUP_COUNT_THREADS = 256
GROUP_COUNT_ITEMS = 8  # entries per thread (independent loads)


class GroupCountConfig(NamedTuple):
    idx_dtype: str  # "int32" or "int64"


GROUP_COUNT_CONFIGS = (GroupCountConfig("int32"), GroupCountConfig("int64"))


def build_group_count(config: GroupCountConfig):
    """prim_func(idx (P,) int, counts (G,) int32 zeroed): counts[g] += #{i: idx[i] == g}."""
    T = _tilelang.T()
    threads, items = GROUP_COUNT_THREADS, GROUP_COUNT_ITEMS
    per_block = threads * items
    bins_per_thread = MAX_EXPERTS // threads
    idx_dtype = config.idx_dtype
    num_entries, num_groups = T.dynamic("num_entries, num_groups")

    @T.prim_func
    def group_count(
        idx: T.Tensor((num_entries,), idx_dtype),
        counts: T.Tensor((num_groups,), "int32"),
    ):
        T.annotate_pass_configs(PASS_CONFIGS)
        with T.Kernel(T.ceildiv(num_entries, per_block), threads=threads) as block:
            tx = T.get_thread_binding()
            hist = T.alloc_shared((MAX_EXPERTS,), "int32")
            values = T.alloc_local((items,), idx_dtype)
            for j in T.unroll(bins_per_thread):
                hist[j * threads + tx] = 0
            first = T.alloc_var("int64", init=T.Cast("int64", block) * per_block)
            for j in T.unroll(items):
                values[j] = T.Cast(idx_dtype, -1)
                if first + j * threads + tx < num_entries:
                    values[j] = idx[first + j * threads + tx]
            T.sync_threads()
            for j in T.unroll(items):
                if values[j] >= T.Cast(idx_dtype, 0) and values[j] < T.Cast(idx_dtype, num_groups):
                    T.atomic_add(hist[T.Cast("int32", values[j])], 1)
            T.sync_threads()
            for j in T.unroll(bins_per_thread):
                if j * threads + tx < num_groups:
                    if hist[j * threads + tx] != 0:
                        T.atomic_add(counts[j * threads + tx], hist[j * threads + tx])

    return group_count


GROUP_COUNT = KernelDef("moe.group_count", build_group_count, GROUP_COUNT_CONFIGS)


def group_count(idx: torch.Tensor, num_groups: int) -> torch.Tensor:
    """int32 (num_groups,): how many entries of idx equal each g in [0, num_groups).

    idx: int32 or int64 (T, K), contiguous, on a CUDA device.  Negative entries
    and entries >= num_groups count nowhere.  No host synchronisation.
    """
    num_groups = eager._check_group_count_args(idx, num_groups)
    _tilelang.require_cuda("idx", idx)
    counts = torch.zeros(num_groups, dtype=torch.int32, device=idx.device)
    if idx.numel() == 0:
        return counts
    config = GroupCountConfig("int64" if idx.dtype == torch.int64 else "int32")
    kernel = _tilelang.kernel_for(GROUP_COUNT, config, idx.device)
    with _tilelang.device_guard(idx.device):
        kernel(idx.reshape(-1), counts)
    return counts
