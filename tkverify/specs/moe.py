"""MoE routing ops."""

import torch

import references.moe
import strategies.moe
from tkverify.policies import bitwise
from tkverify.registry import OpSpec, register, tilelang_impl, torch_impl

register(OpSpec(
    name="moe.topk_gate",
    oracle=references.moe.topk_gate,
    strategy=strategies.moe.topk_gate_cases,
    outputs={"indices": bitwise(torch.int64)},
    impls={
        "torch": torch_impl("kernels.torch.moe:topk_gate"),
        "tilelang": tilelang_impl("kernels.moe:topk_gate"),
    },
    doc="Indices of the k largest scores per row: torch.sort(descending, stable) order, NaN first.",
))
