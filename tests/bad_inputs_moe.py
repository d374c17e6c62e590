"""The bad-argument tables of the MoE functions beyond the first routing ops (family moe_gate: tile-kernels
2.1.0's scored top-k gate, forward and backward).

tests/bad_inputs.py says how a table is written (`Table`, `Bad` and the argument editors);
tests/test_bad_inputs.py merges these into its `TABLES` and runs them.
"""

from __future__ import annotations

import math

import torch

from bad_inputs import Bad, Table, _gen, _put, _with


def _gate_bwd_base() -> dict:
    return {"grad_topk_weights": torch.zeros(4, 2), "logits": torch.zeros(4, 8), "bias": torch.zeros(8),
            "topk_idx": torch.zeros(4, 2, dtype=torch.int64), "topk_weights": torch.zeros(4, 2),
            "scores": torch.zeros(4, 8), "k": 2, "routed_scaling_factor": 1.0}


MOE_GATE = {
    "topk_gate_scored": Table(
        base=lambda: {"logits": torch.randn(4, 8, generator=_gen(0)), "bias": torch.zeros(8), "k": 2,
                      "routed_scaling_factor": 2.5},
        tensors={"logits": torch.float64, "bias": torch.bfloat16}, reference="logits", ints={"k": (0, 9)},
        extra=(Bad("bias-wrong-length", "bias", ValueError, _put("bias", torch.zeros(7))),
               Bad("logits-1025-experts", "logits", ValueError,
                   _with(logits=torch.zeros(2, 1025), bias=torch.zeros(1025))),
               Bad("scaling-inf", "routed_scaling_factor", ValueError, _put("routed_scaling_factor", math.inf)))),
    "topk_gate_scored_bwd": Table(
        base=_gate_bwd_base,
        tensors={"grad_topk_weights": torch.float64, "topk_idx": torch.int32, "scores": torch.float64},
        reference="logits", ints={"k": (0, 9)},
        extra=(Bad("weights-wrong-k", "topk_weights", ValueError, _put("topk_weights", torch.zeros(4, 1))),)),
}
