"""Mutants of the transposes: a tiled kernel whose grid covers only the full tiles."""

from __future__ import annotations

from typing import Any, Callable

import torch

from tkverify.mutants import Mutant

# The TileLang kernels' scalar tile (kernels/transpose.py SCALAR_TILE; the vectorised 1-byte variant uses 128).
TILE = 64
_RAW = {1: torch.uint8, 2: torch.int16, 4: torch.int32}


def tail_tiles_skipped(transpose: Callable[..., Any], tile: int = TILE) -> Callable[..., Any]:
    """The implementation's output with only the full tile x tile tiles kept.

    A grid of floor(M / tile) x floor(N / tile) blocks (floor instead of ceil
    division) never writes the last M % tile columns and N % tile rows of the
    output; they keep what the buffer held, modelled as zero bits.  Shapes
    with a dimension below the tile lose everything.
    """

    def broken(x: torch.Tensor) -> torch.Tensor:
        out = transpose(x)
        rows, cols = out.shape[-2], out.shape[-1]
        raw = out.view(_RAW[out.element_size()])
        raw[..., rows // tile * tile:, :] = 0
        raw[..., :, cols // tile * tile:] = 0
        return out

    return broken


MUTANTS = [
    Mutant("transpose_tail_tile_skipped", "transpose.transpose",
           "the partial tiles (last M % 64 columns and N % 64 rows of the output) are never written",
           model=tail_tiles_skipped),
    Mutant("batched_transpose_tail_tile_skipped", "transpose.batched_transpose",
           "the partial tiles of every batch are never written",
           model=tail_tiles_skipped),
]
