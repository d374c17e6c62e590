"""Building blocks for the `BenchShape`s the specs declare (see `tkverify.bench`).

Inputs are drawn from a generator seeded per shape, on the device asked for,
so every run and every implementation times the same tensors.  Byte counts
are what an op must move, each byte counted once.
"""

from __future__ import annotations

from typing import Any

import torch


def generator(device: torch.device, seed: int = 0) -> torch.Generator:
    return torch.Generator(device=device).manual_seed(seed)


def randn(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device, seed: int = 0) -> torch.Tensor:
    """Standard normal values rounded to `dtype` (fp8 through fp32, as torch converts)."""
    return torch.randn(shape, device=device, generator=generator(device, seed)).to(dtype)


def nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def routing(tokens: int, experts: int, slots: int, alignment: int, device: torch.device, seed: int = 0
            ) -> dict[str, Any]:
    """A realistic routing: each token's `slots` distinct experts, uniformly drawn, no masked slot.

    Returns topk_idx (int64 (T, K)), and the fused_mapping of it (the oracle's: tkverify
    depends on no implementation): token_topk_to_pos, pos_to_token_topk and the row count N.
    """
    from references import moe

    g = generator(device, seed)
    topk_idx = torch.rand(tokens, experts, device=device, generator=g).argsort(dim=1)[:, :slots].contiguous()
    mapping = moe.fused_mapping(topk_idx.cpu(), experts, alignment)

    def on_device(a: Any) -> torch.Tensor:
        return torch.from_numpy(a).to(device)

    return {"topk_idx": topk_idx, "pos_to_token": on_device(mapping[0]), "pos_to_token_topk": on_device(mapping[1]),
            "token_topk_to_pos": on_device(mapping[2]), "num_rows": int(mapping[5])}
