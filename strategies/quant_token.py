"""Choices a cast case makes on top of its hypothesis draws (`strategies.classes.draws_rng`, so that the draws stay
as they are): the TileLang kernel configuration it is moved to (per token: `token_configuration`; per block,
per channel and the fused SwiGLU forward: `format_configuration`), and a rounding probe planted in one block
of a per-token cast's input.  `strategies.quant` uses them."""

from __future__ import annotations

import numpy as np
import torch

import references.quant as ref
from strategies.classes import draws_rng

# H not a multiple of the token_cast kernel's 8-element chunk (its rows are zero-padded to whole chunks),
# with one block a row (num_per_channels = H); e2m1 needs an even H, e5m6 a multiple of 8 (none).
TOKEN_TAIL_HIDDEN = {"e4m3": (7, 13, 100, 1001), "e2m1": (2, 12, 100, 1002)}
TOKEN_CONFIG_STREAM = 15  # `draws_rng`'s stream of per_token_cast_cases' configuration choice
TOKEN_TAIL_SHARE = 0.4


def token_configuration(draws: tuple, fmt: str, hidden: int, npc: int, dtypes: tuple[str, ...]) -> tuple[str, int, int]:
    """(dtype, H, num_per_channels) of a per-token cast: the dtype (of `dtypes`) in turn, and in `TOKEN_TAIL_SHARE` of the
    cases of a format that allows it an H with a partial 8-element chunk (`TOKEN_TAIL_HIDDEN`, one block a
    row), else the drawn H and block.  The case's draws decide (`draws_rng`): the ci profile's few examples
    repeat draws of their own, which left each (dtype, format) configuration of the kernel without a tail."""
    rng = draws_rng(draws, TOKEN_CONFIG_STREAM)
    dtype = dtypes[int(rng.integers(0, len(dtypes)))]
    if fmt in TOKEN_TAIL_HIDDEN and rng.random() < TOKEN_TAIL_SHARE:
        hidden = int(rng.choice(TOKEN_TAIL_HIDDEN[fmt]))
        npc = hidden
    return dtype, hidden, npc


def format_configuration(draws: tuple, stream: int, formats: tuple[str, ...], dtypes: tuple[str, ...],
                         single_row_share: float) -> tuple[str, str, bool, np.random.Generator]:
    """(fmt, dtype, single row, the generator) of a cast case: the (format, dtype) pair, each a configuration of the
    TileLang cast kernels, in turn, and a single row in `single_row_share` of the cases; the case's draws decide
    (`draws_rng`, on `stream`), and the generator is left for the caller's further choices.  The ci profile's few
    examples repeat draws of their own, which left pairs without a single row or a partial chunk."""
    rng = draws_rng(draws, stream)
    which = int(rng.integers(0, len(formats) * len(dtypes)))
    return formats[which % len(formats)], dtypes[which // len(formats)], bool(rng.random() < single_row_share), rng


def options_for_format(options: dict, fmt: str, new_fmt: str, other_clamp_mins: dict[str, tuple]) -> dict:
    """sf options drawn for `fmt`, for a case moved to `new_fmt`: a non-default clamp_min becomes the one of the
    same rank among `new_fmt`'s (`other_clamp_mins`); the rest stays."""
    clamp_min = options["clamp_min"]
    if clamp_min is None or fmt == new_fmt:
        return options
    return {**options, "clamp_min": other_clamp_mins[new_fmt][other_clamp_mins[fmt].index(clamp_min)]}


PROBE_STREAM = 16  # `draws_rng`'s stream of `plant_rounding_probe`
PROBE_SHARE = 1 / 2
# e2m1's midpoints where rounding half to even and half away from zero part (0.25 -> 0 or 0.5, 1.25 -> 1 or 1.5,
# 2.5 -> 2 or 3, 5 -> 4 or 6), and those where they agree (0.75, 1.75, 3.5)
E2M1_TIES = (0.25, 1.25, 2.5, 5.0, 0.75, 1.75, 3.5)


def reciprocal_probes(fmt: str) -> np.ndarray:
    """The bf16 values a in [1, 2) whose fp32 sf a / max_q, taken as a * fp32(1 / max_q) (two roundings),
    lies more than 3/4 of an fp32 ULP from the exact quotient (a correctly rounded division: at most 1/2)."""
    a = 1.0 + np.arange(128) / 128.0
    max_q = ref.MAX_Q[fmt]
    exact = a / max_q
    by_reciprocal = (np.float32(a) * np.float32(1.0 / max_q)).astype(np.float64)
    ulp = np.spacing(np.float32(exact)).astype(np.float64)
    return a[np.abs(by_reciprocal - exact) > 0.75 * ulp]


def plant_rounding_probe(x: torch.Tensor, fmt: str, npc: int, plain_sf: bool, draws: tuple) -> None:
    """One block of x becomes a probe of the cast's rounding, the case's draws deciding where
    (`strategies.classes.draws_rng`): where the sf is a plain fp32 one and the format has such amaxes, always,
    an amax whose sf a / max_q lies within 1/4 of an fp32 ULP of a midpoint (`reciprocal_probes`), so that an
    sf taken by a reciprocal rounds to the other side; for e2m1, in about PROBE_SHARE of the cases, an amax of
    6 * 2^j (sf 2^j exactly, in every sf mode) beside e2m1 midpoints times 2^j (`E2M1_TIES`: exact ties of
    x / sf).  Planted in the input tensor, after the pinned specials (which would otherwise make the block's
    amax NaN).  The drawn blocks reach such amaxes and elements too seldom for the ci profile's 30 examples to
    tell an extra rounding of the sf, or rounding half away from zero."""
    rows, hidden = x.shape
    if rows == 0 or hidden == 0:
        return
    rng = draws_rng(draws, PROBE_STREAM)
    probes = reciprocal_probes(fmt) if plain_sf else np.zeros(0)
    ties = fmt == "e2m1" and rng.random() < PROBE_SHARE
    if not (ties or probes.size):
        return
    row, block = int(rng.integers(0, rows)), int(rng.integers(0, hidden // npc))
    scale = 2.0 ** int(rng.integers(-4, 5))
    signs = rng.choice((-1.0, 1.0), size=npc)
    if ties:
        values = rng.choice(E2M1_TIES, size=npc)
        values[0] = 6.0
    else:
        amax = float(rng.choice(probes)) if probes.size else 1.0
        values = amax * rng.uniform(0.0, 1.0, size=npc)
        values[0] = amax
    # every value is a bf16 one times a power of two in the normal range: exact in x's dtype
    x[row, block * npc:(block + 1) * npc] = torch.from_numpy(signs * values * scale).to(x.dtype)
