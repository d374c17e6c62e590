"""Deliberately broken implementations, registered the way a user registers a kernel.

Loaded only on request (``--tk-load broken`` with tests/ on the path), so that
the real suite never sees them.  Each must make the differential suite fail.
"""

import torch

from tkverify.registry import Impl, register_impl


def topk_ties_to_higher_index(scores: torch.Tensor, k: int) -> torch.Tensor:
    """Top-k whose ties go to the higher index: sort the reversed row, map indices back."""
    e = scores.shape[1]
    flipped = torch.sort(scores.flip(1), dim=1, descending=True, stable=True).indices[:, :k]
    return (e - 1 - flipped).contiguous()


def transpose_dropping_tail_column(x: torch.Tensor) -> torch.Tensor:
    """A transpose that forgets the input's last column (a skipped tail tile)."""
    out = x.transpose(-1, -2).contiguous()
    if out.shape[-2] > 0:
        out[..., -1, :] = torch.zeros((), dtype=out.dtype)
    return out


register_impl("moe.topk_gate", Impl("ties_high", topk_ties_to_higher_index, device="cpu"))
register_impl("transpose.transpose", Impl("drop_tail", transpose_dropping_tail_column, device="cpu"))
