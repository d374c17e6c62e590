"""Mutants of the MoE routing ops.

The models (input or output perturbations of the implementation under test)
reproduce the named bug exactly, so the same factory serves the eager code and
the TileLang kernels.  The eager factories are copies of the steps of
kernels/torch/moe.py with the one step changed.

The "unwritten" mutants allocate their output with torch.empty and leave the
padding rows as the allocator hands them out: they are caught because the
differential checks poison every uninitialised allocation of an implementation
call (`tkverify.poison`), so every padding element fails.  Without the poison
what the padding holds is chance: the CPU allocator's recycled memory held
other bytes in the ci examples (caught, with fewer failing elements), but
fresh pages are zero, and zero is what expand_to_fused's padding must hold.
"""

from __future__ import annotations

from typing import Any, Callable

import torch

import kernels.torch.moe as eager
from tkverify.mutants import Mutant, unwritten_rows

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


def nan_tied_with_inf(topk_gate: Callable[..., Any]) -> Callable[..., Any]:
    """The implementation run on scores with every NaN replaced by +inf: NaN ties with +inf (the
    tie going to the lower index) instead of ranking above it.  Exact: nothing else changes."""

    def broken(scores: torch.Tensor, k: int) -> torch.Tensor:
        return topk_gate(torch.where(torch.isnan(scores), torch.inf, scores).contiguous(), k)

    return broken


def eager_nan_tied_with_inf(topk_gate: Callable[..., Any]) -> Callable[..., Any]:
    """The eager topk_gate without the stable pass that lifts NaNs above the +inf they tie with."""

    def broken(scores: torch.Tensor, k: int) -> torch.Tensor:
        eager._check_topk_gate_args(scores, k)
        keys = torch.where(torch.isnan(scores), torch.inf, scores) + 0.0
        return torch.sort(keys, dim=1, descending=True, stable=True).indices[:, : int(k)].contiguous()

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


def _reached_rows(token_topk_to_pos: torch.Tensor, num_rows: int, device: torch.device) -> torch.Tensor:
    """bool (num_rows,): the rows some (token, slot) pair's position names."""
    pos = token_topk_to_pos.to(torch.int64).reshape(-1)
    pos = pos[(pos >= 0) & (pos < num_rows)]
    reached = torch.zeros(num_rows, dtype=torch.bool, device=device)
    reached[pos.to(device)] = True
    return reached


def eager_expand_padding_unwritten(expand: Callable[..., Any]) -> Callable[..., Any]:
    """Factory: the eager expand_to_fused with out allocated by torch.empty instead of torch.zeros
    and only the rows a pair reaches written: the padding rows keep what the allocator handed out.
    (With x_sf the spec's torch implementation is a layout wrapper around the eager function, so
    the sf mutant is the model `expand_padding_unwritten(1)`.)"""

    def broken(x: torch.Tensor, token_topk_to_pos: torch.Tensor, num_expanded_rows: int) -> torch.Tensor:
        num_rows = eager._check_expand_args(x, token_topk_to_pos, num_expanded_rows, None)
        out = torch.empty((num_rows, x.shape[1]), dtype=x.dtype, device=x.device)
        moved = torch.zeros_like(out)
        eager._scatter_rows(x, token_topk_to_pos, moved)
        reached = _reached_rows(token_topk_to_pos, num_rows, x.device)
        bits = _RAW[out.element_size()]  # rows move as raw bits (fp8 has no index_put)
        out.view(bits)[reached] = moved.view(bits)[reached]
        return out

    return broken


def expand_padding_unwritten(which: int) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Factory (model): any expand_to_fused whose output number `which` (0 out, 1 out_sf) keeps
    only the rows a pair reaches, in a torch.empty buffer of the same layout (`unwritten_rows`)."""

    def factory(expand: Callable[..., Any]) -> Callable[..., Any]:
        def broken(x: torch.Tensor, token_topk_to_pos: torch.Tensor, num_expanded_rows: int, **kwargs: Any) -> Any:
            result = expand(x=x, token_topk_to_pos=token_topk_to_pos, num_expanded_rows=num_expanded_rows, **kwargs)
            outputs = list(result) if isinstance(result, tuple) else [result]
            target = outputs[which]
            outputs[which] = unwritten_rows(target, _reached_rows(token_topk_to_pos, target.shape[0], target.device))
            return tuple(outputs) if isinstance(result, tuple) else outputs[0]
        return broken

    return factory


def fused_mapping_padding_unwritten(mapping: Callable[..., Any]) -> Callable[..., Any]:
    """fused_mapping writing pos_to_token and pos_to_token_topk only at the rows a pair lands on:
    the padding rows, -1 by the contract, keep what torch.empty handed out (`unwritten_rows`)."""

    def broken(*args: Any, **kwargs: Any) -> Any:
        pos_to_token, pos_to_token_topk, *rest = mapping(*args, **kwargs)
        real = pos_to_token_topk >= 0
        return (unwritten_rows(pos_to_token, real), unwritten_rows(pos_to_token_topk, real), *rest)

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
    Mutant("topk_nan_tied_with_inf", "moe.topk_gate",
           "top-k lets NaN tie with +inf (the lower index first) instead of ranking it above +inf",
           eager=eager_nan_tied_with_inf, model=nan_tied_with_inf),
    Mutant("expand_padding_rows_unwritten", "moe.expand_to_fused",
           "expand_to_fused allocates out with torch.empty and never writes its padding rows",
           eager=eager_expand_padding_unwritten, model=expand_padding_unwritten(0)),
    Mutant("expand_sf_padding_rows_unwritten", "moe.expand_to_fused_with_sf",
           "expand_to_fused with x_sf allocates out_sf with torch.empty and never writes its padding rows",
           model=expand_padding_unwritten(1)),
    Mutant("fused_mapping_padding_rows_unwritten", "moe.fused_mapping",
           "fused_mapping never writes the -1 of the padding rows of pos_to_token and pos_to_token_topk",
           model=fused_mapping_padding_unwritten),
    Mutant("reduce_accumulates_masked_slots", "moe.reduce_fused",
           "reduce_fused adds the terms of masked slots (token_topk_to_pos == -1), reading row -1",
           model=masked_slots_accumulated),
]
