"""TileLang kernels of the MoE routing ops; what each op computes is in docs/contract/moe.md.

Signatures, return conventions and argument checks are those of ``kernels/torch/moe.py``: each
wrapper runs the eager module's argument check (same errors for the same bad arguments), then asks
for what only the kernels need: a CUDA device and dimensions that fit an int32.  A module holds one
op: its static configurations, the builders of its kernels, their design next to why it is exact,
and the PyTorch-facing wrapper.

- `gate`: topk_gate, a warp a row picking the k largest order keys.
- `histogram`: group_count, a shared-memory histogram a block, added to the global counts.
- `mapping`: fused_mapping, a deterministic counting sort of the (token, slot) pairs by expert.
- `expand`: expand_to_fused's wrapper and kernel registry entry, over `expand_config` (its static
  configurations and which one a call launches), `expand_rows` (the map, row and sf-column
  kernels) and `expand_gather` (the order and gather kernels that 16-byte rows ship with).
- `reduce`: reduce_fused, a gather summing each token's K rows in slot order.
- `normalize`: normalize_weight, a thread a token.
- `common`: the limits and pass configs the modules share.

Large launches: grids are 1-D; kernels whose block count can exceed 2**31 - 1 take
(num_blocks, block_offset) and the wrappers launch them in pieces.  All global accesses are
guarded explicitly (tilelang's own bounds legalisation is disabled, as in kernels/transpose.py,
because it would add per-lane checks that block vectorization).
"""

from .expand import EXPAND_TO_FUSED, expand_to_fused
from .expand_config import (EXPAND_OVERRIDES, EXPAND_SHIPPED, EXPAND_TUNE_CONFIGS, ExpandConfig,
                            expand_rows_config)
from .expand_gather import ORDER_SLOTS
from .gate import TOPK_GATE, TopkGateConfig, config_for_experts, topk_gate
from .histogram import GROUP_COUNT, GroupCountConfig, group_count
from .mapping import FUSED_MAPPING, MappingConfig, default_chunk_batches, fused_mapping
from .normalize import NORMALIZE_WEIGHT, NormalizeConfig, normalize_weight
from .reduce import REDUCE_FUSED, ReduceConfig, reduce_fused

__all__ = [
    "topk_gate", "group_count", "fused_mapping", "expand_to_fused", "reduce_fused", "normalize_weight",
    "TOPK_GATE", "GROUP_COUNT", "FUSED_MAPPING", "EXPAND_TO_FUSED", "REDUCE_FUSED", "NORMALIZE_WEIGHT",
    "TopkGateConfig", "GroupCountConfig", "MappingConfig", "ExpandConfig", "ReduceConfig", "NormalizeConfig",
    "EXPAND_TUNE_CONFIGS", "EXPAND_SHIPPED", "EXPAND_OVERRIDES", "expand_rows_config", "ORDER_SLOTS",
    "config_for_experts", "default_chunk_batches",
]
