"""Strategies for the MoE operators (docs/contract/moe.md).

- `strategies.moe.gate`: `topk_gate_cases`, score matrices aimed at the edges of the gate's total order
  (ties at the k-th place, signed zeros, subnormals, infinities, NaNs of any payload).
- `strategies.moe.routing`: the routing chain's cases (`group_count_cases`, `fused_mapping_cases`,
  `expand_to_fused_cases`, `expand_to_fused_with_sf_cases`, `reduce_fused_cases`,
  `normalize_weight_cases`), each built from a drawn routing (topk_idx) and values aimed at the op's edges.
"""

from strategies.moe.gate import (EXPERT_COUNTS, LARGEST_TOKENS, SPECIAL_SCORES, TOKEN_TAILS, TOPK_VALUES,
                                 build_scores, token_counts, topk_gate_cases)
from strategies.moe.routing import (ALIGNMENTS, EXPAND_DTYPES, HIDDEN_SIZES, MASK, MAX_ROUTED_ELEMENTS,
                                    QUANTISED_DTYPES, REDUCE_DTYPES, ROUTING_EXPERT_COUNTS, ROUTING_TOPK,
                                    ROUTINGS, SF_COLUMNS, SF_DTYPES, SF_LAYOUTS, build_positions,
                                    build_reduce_inputs, build_topk_idx, build_weights, expand_to_fused_cases,
                                    expand_to_fused_with_sf_cases, fused_mapping_cases, group_count_cases,
                                    normalize_weight_cases, reduce_fused_cases, routings)

__all__ = [
    "ALIGNMENTS", "EXPAND_DTYPES", "EXPERT_COUNTS", "HIDDEN_SIZES", "LARGEST_TOKENS", "MASK", "MAX_ROUTED_ELEMENTS",
    "QUANTISED_DTYPES", "REDUCE_DTYPES", "ROUTINGS", "ROUTING_EXPERT_COUNTS", "ROUTING_TOPK", "SF_COLUMNS",
    "SF_DTYPES", "SF_LAYOUTS", "SPECIAL_SCORES", "TOKEN_TAILS", "TOPK_VALUES", "build_positions",
    "build_reduce_inputs", "build_scores", "build_topk_idx", "build_weights", "expand_to_fused_cases",
    "expand_to_fused_with_sf_cases", "fused_mapping_cases", "group_count_cases", "normalize_weight_cases",
    "reduce_fused_cases", "routings", "token_counts", "topk_gate_cases",
]
