"""TileLang GPU implementations of the operators that docs/contract/ defines.

Each module or package holds one family (``kernels.moe``, ``kernels.transpose``): a thin
PyTorch-facing wrapper that validates its arguments and picks a static
configuration, and a builder that returns the TileLang ``prim_func`` for that
configuration.  TileLang itself is imported lazily (see ``kernels._tilelang``),
so importing this package, or a family module, never imports tilelang.

``KERNELS`` is the one list of TileLang kernels: ``python -m kernels.precompile``
and ``tests/test_lowering.py`` iterate it, each over every static
configuration of every kernel.
"""

# kernel name -> "module:attribute" of its `KernelDef` (resolved lazily by
# `kernels._tilelang.kernel_defs`, so listing a kernel imports nothing).
KERNELS = {
    "moe.topk_gate": "kernels.moe:TOPK_GATE",
    "moe.group_count": "kernels.moe:GROUP_COUNT",
    "moe.fused_mapping": "kernels.moe:FUSED_MAPPING",
    "moe.expand_to_fused": "kernels.moe:EXPAND_TO_FUSED",
    "moe.reduce_fused": "kernels.moe:REDUCE_FUSED",
    "moe.normalize_weight": "kernels.moe:NORMALIZE_WEIGHT",
    "moe.topk_sum_and_topk_group_idx": "kernels.moe.groups:TOPK_GROUP_IDX",
    "moe.unique_group_indices": "kernels.moe.groups:UNIQUE_GROUP_INDICES",
    "moe.aux_fi": "kernels.moe.groups:FI_FROM_COUNTS",
    "moe.top2_sum_gate": "kernels.moe.tp:TOP2_SUM_GATE",
    "moe.mask_indices_by_tp": "kernels.moe.tp:MASK_INDICES_BY_TP",
    "moe.topk_gate_scored": "kernels.moe.gate_scored:TOPK_GATE_SCORED",
    "moe.topk_gate_scored_bwd": "kernels.moe.gate_scored:TOPK_GATE_SCORED_BWD",
    "transpose.batched_transpose": "kernels.transpose:BATCHED_TRANSPOSE",
    "quant.token_cast": "kernels.quant:TOKEN_CAST",
    "quant.block_cast": "kernels.quant:BLOCK_CAST",
    "quant.cast_back": "kernels.quant:CAST_BACK",
    "quant.lossless": "kernels.quant.lossless:LOSSLESS",
    "quant.weight_sf_layout": "kernels.quant.sf_layout:WEIGHT_SF_LAYOUT",
    "quant.swiglu_plain": "kernels.quant.swiglu_plain:SWIGLU_PLAIN",
    "quant.norm_fwd": "kernels.quant.norm:NORM_FWD",
    "quant.norm_bwd": "kernels.quant.norm:NORM_BWD",
    "quant.norm_wgrad": "kernels.quant.norm:NORM_WGRAD",
    "engram.gate_fwd": "kernels.engram:GATE_FWD",
    "engram.gate_bwd": "kernels.engram:GATE_BWD",
    "engram.grad_w_reduce": "kernels.engram:GRAD_W_REDUCE",
    "engram.fused_weight": "kernels.engram:FUSED_WEIGHT",
    "engram.hash": "kernels.engram:ENGRAM_HASH",
    "mhc.sinkhorn": "kernels.mhc:SINKHORN",
    "mhc.sinkhorn_bwd": "kernels.mhc:SINKHORN_BWD",
    "mhc.pre_split_mixes": "kernels.mhc:PRE_SPLIT_MIXES",
    "mhc.pre_apply_mix": "kernels.mhc:PRE_APPLY_MIX",
    "mhc.post": "kernels.mhc:POST",
    "mhc.pre_apply_mix_bwd": "kernels.mhc:PRE_APPLY_MIX_BWD",
    "mhc.post_bwd": "kernels.mhc:POST_BWD",
    "mhc.pre_split_mixes_bwd": "kernels.mhc:PRE_SPLIT_MIXES_BWD",
    "mhc.expand_to_mhc": "kernels.mhc.expand:EXPAND_TO_MHC",
    "mhc.expand_to_mhc_bwd": "kernels.mhc.expand:EXPAND_TO_MHC_BWD",
    "mhc.head_compute_mix": "kernels.mhc.head_mix:HEAD_COMPUTE_MIX",
    "mhc.head_compute_mix_bwd": "kernels.mhc.head_mix:HEAD_COMPUTE_MIX_BWD",
    "mhc.norm_fn": "kernels.mhc.fused_norm:NORM_FN",
    "mhc.norm_fn_bwd": "kernels.mhc.fused_norm:NORM_FN_BWD",
    "mhc.reduce_partials_and_rmsnorm": "kernels.mhc.fused_norm:REDUCE_RMSNORM",
    "mhc.reduce_partials_and_rmsnorm_bwd": "kernels.mhc.fused_norm:REDUCE_RMSNORM_BWD",
}
