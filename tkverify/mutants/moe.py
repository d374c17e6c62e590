"""Mutants of the MoE routing ops.

All three are models (input or output perturbations of the implementation
under test) that reproduce the named bug exactly, so the same factory serves
the eager code and the TileLang kernels.
"""

from __future__ import annotations

from typing import Any, Callable

import torch

from tkverify.mutants import Mutant

_RAW = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def ties_to_higher_index(topk_gate: Callable[..., Any]) -> Callable[..., Any]:
    """The implementation run on each row reversed, its indices mapped back (e - 1 - i).

    Reversing the row changes nothing but which of two equal scores has the
    lower index (NaNs, which torch.sort orders as equal, included), so this is
    exactly a top-k whose ties go to the higher index.
    """

    def broken(scores: torch.Tensor, k: int) -> torch.Tensor:
        num_experts = scores.shape[1]
        picked = topk_gate(scores.flip(1).contiguous(), k)
        return (num_experts - 1 - picked).contiguous()

    return broken


def _garbage(shape: tuple[int, ...], raw: torch.dtype, device: torch.device) -> torch.Tensor:
    """Fixed pseudo-random bits: what a buffer that was never written holds (never all zero)."""
    info = torch.iinfo(raw)
    g = torch.Generator().manual_seed(0x5EED)
    bits = torch.randint(info.min, info.max, shape, generator=g, dtype=torch.int64)
    return bits.to(raw).to(device)


def padding_rows_garbage(expand: Callable[..., Any]) -> Callable[..., Any]:
    """expand_to_fused leaving the rows no (token, slot) pair reaches unwritten.

    The output rows that no valid position names (alignment padding, and the
    spare rows of a scattered layout) get fixed pseudo-random bits instead of
    zeros, as an allocation with torch.empty (or a kernel that skips them)
    would leave them.  Only `out` is touched; an sf output keeps its zeros.
    """

    def broken(x: torch.Tensor, token_topk_to_pos: torch.Tensor, num_expanded_rows: int, *args: Any,
               **kwargs: Any) -> Any:
        result = expand(x, token_topk_to_pos, num_expanded_rows, *args, **kwargs)
        out = result[0] if isinstance(result, tuple) else result
        if out.numel():
            pos = token_topk_to_pos.to(torch.int64).reshape(-1)
            pos = pos[(pos >= 0) & (pos < num_expanded_rows)]
            written = torch.zeros(num_expanded_rows, dtype=torch.bool, device=out.device)
            written[pos.to(out.device)] = True
            raw = out.view(_RAW[out.element_size()])
            raw[~written] = _garbage(tuple(raw.shape), raw.dtype, raw.device)[~written]
        return result

    return broken


def masked_slots_accumulated(reduce: Callable[..., Any]) -> Callable[..., Any]:
    """reduce_fused without the `pos >= 0` test: a masked slot (-1) is summed too, reading row -1.

    Modelled by handing the implementation positions in which every -1 is
    replaced by N - 1, the row that eager code without the test reads
    (``rows[-1]`` in torch indexing); with N = 0 there is no row to read and
    nothing changes.
    """

    def broken(x: torch.Tensor, topk_weights: torch.Tensor, token_topk_to_pos: torch.Tensor,
               x_sf: torch.Tensor | None = None) -> torch.Tensor:
        num_rows = x.shape[0]
        if num_rows:
            token_topk_to_pos = torch.where(token_topk_to_pos == -1, num_rows - 1, token_topk_to_pos)
            token_topk_to_pos = token_topk_to_pos.to(torch.int32).contiguous()
        if x_sf is None:
            return reduce(x, topk_weights, token_topk_to_pos)
        return reduce(x, topk_weights, token_topk_to_pos, x_sf)

    return broken


MUTANTS = [
    Mutant("topk_ties_to_higher_index", "moe.topk_gate",
           "top-k ties (equal scores, NaNs) go to the higher index instead of the lower",
           model=ties_to_higher_index),
    Mutant("expand_padding_rows_garbage", "moe.expand_to_fused",
           "expand_to_fused leaves the padding rows unwritten (garbage) instead of zero",
           model=padding_rows_garbage),
    Mutant("reduce_accumulates_masked_slots", "moe.reduce_fused",
           "reduce_fused adds the terms of masked slots (token_topk_to_pos == -1), reading row -1",
           model=masked_slots_accumulated),
]
