"""The bad-argument tables of tile-kernels 1.0's grouped gate and its tensor-parallel masking (family moe_tp:
top2_sum_gate, mask_indices_by_tp).

tests/bad_inputs.py says how a table is written (`Table`, `Bad` and the argument editors);
tests/test_bad_inputs.py merges these into its `TABLES` and runs them.
"""

from __future__ import annotations

import math

import torch

from bad_inputs import Bad, Table, _gen, _put, _with


def _gate_base() -> dict:
    return {"logits": torch.randn(4, 16, generator=_gen(0)), "bias": torch.zeros(16), "num_topk": 4,
            "num_topk_groups": 2, "num_groups": 4, "routed_scaling_factor": 2.5, "scoring_func": "sigmoid",
            "mask": torch.tensor([True, False, True, True])}


MOE_TP = {
    "top2_sum_gate": Table(
        base=_gate_base,
        tensors={"logits": torch.float64, "bias": torch.bfloat16, "mask": torch.uint8}, reference="logits",
        ints={"num_topk": (0, 9), "num_topk_groups": (0, 5), "num_groups": (0, 3, 33)},
        floats={"routed_scaling_factor": (0.0, -1.0, math.inf, math.nan)},
        extra=(Bad("bias-wrong-length", "bias", ValueError, _put("bias", torch.zeros(15))),
               Bad("mask-wrong-length", "mask", ValueError, _put("mask", torch.ones(3, dtype=torch.bool))),
               Bad("logits-no-experts", "logits", ValueError, _with(logits=torch.zeros(4, 0), bias=torch.zeros(0))),
               Bad("logits-1025-experts", "logits", ValueError,
                   _with(logits=torch.zeros(2, 1025), bias=torch.zeros(1025), num_groups=5)),
               Bad("groups-of-one-expert", "num_topk_groups", ValueError,
                   _with(num_groups=16, num_topk_groups=8)),
               Bad("scoring-identity", "scoring_func", ValueError, _put("scoring_func", "identity")))),
    "mask_indices_by_tp": Table(
        base=lambda: {"indices": torch.randint(-1, 16, (4, 8), generator=_gen(0)), "n": 16, "num_ep_ranks": 4,
                      "tp_rank": 1, "num_tp_ranks": 2},
        tensors={"indices": torch.int32}, reference="indices",
        ints={"n": (0, 2**31), "num_ep_ranks": (0, 3, 32), "tp_rank": (-1, 2), "num_tp_ranks": (0, 3, 8)},
        extra=(Bad("no-slots", "indices", ValueError, _put("indices", torch.zeros(4, 0, dtype=torch.int64))),
               Bad("33-slots", "indices", ValueError, _put("indices", torch.zeros(4, 33, dtype=torch.int64))))),
}
