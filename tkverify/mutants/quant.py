"""Mutants of the quantisation family.

Rounding mutants (truncation, ties away from zero, no saturation) change the
one step that turns a quotient into a code.  In the eager code
(kernels/torch/quant.py) that is the format's encoder (``_encode_e4m3``,
``_encode_e2m1``, ``_encode_e5m6``): the mutant swaps it for one that re-rounds
the encoder's codes from the same fp32 quotient it was given (`reround`).  For
any other implementation the model re-rounds the returned codes the same way,
from the IEEE fp32 quotient x / sf with the implementation's own sf - "where
the kernel rounded to nearest, it rounded towards zero instead".  (The fp32
quotient, not the exact one: a block's amax divided by a plain sf is 448 in
fp32 but 447.99999 exactly, and truncating that would break every block, more
than a kernel that truncates its own fp32 quotient does.)

The sf mutants change the sf step: eager ``_power_of_two_at_least`` (round_sf)
halved where it rounded up, ``_scales`` called with clamp_min 0.  Their models
are described at each factory.  The SwiGLU mutants are models of the
implementation itself, for every implementation.
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np
import torch

import references.quant as ref
from tkverify import formats
from tkverify.mutants import Mutant, original, patched, unwritten_rows

EAGER = "kernels.torch.quant"
_ENCODERS = {"e4m3": "_encode_e4m3", "e2m1": "_encode_e2m1", "e5m6": "_encode_e5m6"}


# -- re-rounding codes ------------------------------------------------------------------


def reround(codes: np.ndarray, q: np.ndarray, fmt: str, mode: str) -> np.ndarray:
    """Codes of `fmt` (RNE_sat of the quotients q) as another rounding would have given them.

    toward_zero    one code towards zero wherever RNE went away from zero (truncation);
    ties_away      one code away from zero at exact ties that RNE broke towards zero;
    no_saturation  the format's NaN wherever the unsaturated RNE of q exceeds the
                   largest finite value (|q| > max + ulp(max) / 2; e4m3's 448 has an even
                   significand, so the tie 464 still goes to 448).
    NaN codes, infinities and NaN quotients are left alone (except q = +-inf under no_saturation).
    """
    f = formats.get(fmt)
    c = np.asarray(codes).astype(np.int64)
    sign = 1 << (f.bits - 1)
    mag = c & (sign - 1)
    top = int(f.encode(np.array([f.max_finite]))[0]) & (sign - 1)
    finite = mag <= top
    here = np.abs(f.decode(np.minimum(mag, top).astype(f.code_dtype)))
    aq = np.abs(np.asarray(q, dtype=np.float64))
    with np.errstate(invalid="ignore", over="ignore"):
        if mode == "toward_zero":
            c = np.where(finite & (here > aq), c - 1, c)
        elif mode == "ties_away":
            up = np.abs(f.decode(np.minimum(mag + 1, top).astype(f.code_dtype)))
            c = np.where(finite & (mag < top) & (here < aq) & (aq - here == up - aq), c + 1, c)
        elif mode == "no_saturation":
            if not f.has_nan:
                raise ValueError(f"{fmt} has no NaN to overflow to")
            nan_mag = int(f.encode(np.array([np.nan]))[0]) & (sign - 1)
            beyond = aq > f.overflow_threshold
            c = np.where(finite & beyond, (c & sign) | nan_mag, c)
        else:
            raise ValueError(f"unknown rounding mode {mode!r}")
    return c.astype(f.code_dtype)


def _rerounding_encoder(fmt: str, mode: str) -> Callable[..., torch.Tensor]:
    """The eager encoder of `fmt` with its rounding replaced (same inputs, same storage)."""
    encode = original(EAGER, _ENCODERS[fmt])

    def encoder(q: torch.Tensor, *args: Any) -> torch.Tensor:
        codes = encode(q, *args)
        raw = codes.view(torch.uint8) if fmt == "e4m3" else codes  # e2m1: uint8, e5m6: int16
        new = reround(raw.cpu().numpy(), q.detach().cpu().double().numpy(), fmt, mode)
        out = torch.from_numpy(new.astype(raw.cpu().numpy().dtype)).to(codes.device)
        return out.view(torch.float8_e4m3fn) if fmt == "e4m3" else out

    return encoder


def eager_rounding(fmt: str, mode: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Factory: the eager cast with `fmt`'s encoder rounding by `mode`."""
    def factory(fn: Callable[..., Any]) -> Callable[..., Any]:
        return patched(fn, EAGER, **{_ENCODERS[fmt]: _rerounding_encoder(fmt, mode)})
    return factory


def model_rounding(fmt: str, mode: str, precomputed: bool = False) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Factory: any per-token cast (or per_token_cast_with_precomputed_sf) with its `fmt` codes
    re-rounded by `mode` from the fp32 quotient x / sf (IEEE division), sf being the
    implementation's own (or the given one)."""

    def factory(cast: Callable[..., Any]) -> Callable[..., Any]:
        def broken(x: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
            if precomputed:
                sf, fmt_, npc = _bind(args, kwargs, ("sf", None), ("fmt", "e4m3"), ("num_per_channels", 128))
                data = cast(x, *args, **kwargs)
            else:
                fmt_, npc = _bind(args, kwargs, ("fmt", "e4m3"), ("num_per_channels", 128))
                data, sf = cast(x, *args, **kwargs)
            if fmt_ != fmt:
                return data if precomputed else (data, sf)
            block = (1, npc)
            cols = ref.sf_grid(x.shape[0], x.shape[1], block)[1]
            sf_elements = ref.expand_to_elements(ref.sf_logical_values(sf, cols), tuple(x.shape), block)
            with np.errstate(divide="ignore", invalid="ignore", over="ignore", under="ignore"):
                q = ref.as_float64(x).astype(np.float32) / sf_elements.astype(np.float32)
            new = ref.pack_data(reround(ref.data_codes(data, fmt), q, fmt, mode), fmt).to(data.device)
            return new if precomputed else (new, sf)
        return broken

    return factory


def _bind(args: tuple, kwargs: dict, *names: tuple[str, Any]) -> list[Any]:
    """Values of leading parameters given positionally or by keyword (with defaults)."""
    return [args[i] if i < len(args) else kwargs.get(name, default) for i, (name, default) in enumerate(names)]


# -- the sf step -------------------------------------------------------------------------------


def eager_sf_rounded_down(fn: Callable[..., Any]) -> Callable[..., Any]:
    """round_sf's power of two 2^floor(log2(a / max_q)) instead of 2^ceil: the eager
    ``_power_of_two_at_least`` halved wherever it had to round up."""
    at_least = original(EAGER, "_power_of_two_at_least")

    def at_most(ratio: torch.Tensor, a: torch.Tensor, max_q: float) -> torch.Tensor:
        up = at_least(ratio, a, max_q)
        return torch.where(max_q * up == a, up, up * 0.5)

    return patched(fn, EAGER, _power_of_two_at_least=at_most)


def _token_blocks(x: torch.Tensor, sf: torch.Tensor, fmt: str, num_per_channels: int,
                  clamp_min: float | None) -> tuple[tuple[int, int], np.ndarray, np.ndarray, np.ndarray]:
    """What the sf mutants start from: the block (1, num_per_channels), x in float64, the sf's logical values
    (rows, cols) and a = max(block amax, clamp_min) per block, exact."""
    block = (1, num_per_channels)
    x64 = ref.as_float64(x)
    values = ref.sf_logical_values(sf, ref.sf_grid(x.shape[0], x.shape[1], block)[1])
    return block, x64, values, np.maximum(ref.block_amax(x64, block), ref.clamp_min_value(fmt, clamp_min))


def model_sf_rounded_down(cast: Callable[..., Any]) -> Callable[..., Any]:
    """Any per-token cast with round_sf: its sf halved wherever a / max_q is not a power of two
    (a = max(amax, clamp_min), exact), written back into its own sf tensor (storage and layout
    kept), and the data re-quantised with that sf by correct rounding (the reference encoder),
    so that only the sf is wrong - as in a kernel that rounds the exponent down and quantises
    with the sf it got."""

    def broken(x: torch.Tensor, fmt: str = "e4m3", num_per_channels: int = 128, **options: Any) -> Any:
        data, sf = cast(x, fmt, num_per_channels, **options)
        if not options.get("round_sf", False) or x.shape[0] == 0:
            return data, sf
        block, x64, values, a = _token_blocks(x, sf, fmt, num_per_channels, options.get("clamp_min"))
        with np.errstate(invalid="ignore", over="ignore"):
            down = np.where(np.isfinite(values) & (values * ref.MAX_Q[fmt] != a), values / 2, values)
        stored = ref.store_sf(down, use_ue8m0=options.get("use_ue8m0", False),
                              use_packed_ue8m0=options.get("use_packed_ue8m0", False))
        sf.copy_(stored.to(sf.device))
        codes = ref.encode_elements(ref.quotients(x64, down, block), fmt)
        return ref.pack_data(codes, fmt).to(data.device), sf

    return broken


def eager_clamp_min_ignored(fn: Callable[..., Any]) -> Callable[..., Any]:
    """The eager ``_scales`` with clamp_min 0: a = amax (all-zero blocks get sf 0)."""
    scales = original(EAGER, "_scales")

    def without_clamp_min(y, fmt, block, round_sf, clamp_min):
        return scales(y, fmt, block, round_sf, 0.0)

    return patched(fn, EAGER, _scales=without_clamp_min)


def model_clamp_min_ignored(cast: Callable[..., Any]) -> Callable[..., Any]:
    """Any cast called with the smallest clamp_min the contract accepts (max_q * 2^-126) instead
    of the one asked for: clamp_min ignored wherever amax lies above that floor.  Weaker than
    the real bug below it (an all-zero block gets a tiny sf, not 0), and identical to the
    correct cast for e2m1's default clamp_min, which is that floor."""

    def broken(x: torch.Tensor, fmt: str = "e4m3", *args: Any, **options: Any) -> Any:
        options["clamp_min"] = ref.MAX_Q[fmt] * 2.0**-126
        return cast(x, fmt, *args, **options)

    return broken


def eager_sf_by_reciprocal(fn: Callable[..., Any]) -> Callable[..., Any]:
    """The eager ``_scales`` taking the fp32 sf (no round_sf) as amax * fp32(1 / max_q), not amax / max_q: one
    rounding more (1 / max_q is inexact for 448, 6 and 65024), up to about an ULP off where the division is
    correctly rounded.  The data is quantised with that sf, as a kernel that multiplies by the reciprocal
    quantises with the sf it computed; the contract's fp32 window admits it, the torch claim does not."""
    scales, blocks = original(EAGER, "_scales"), original(EAGER, "_blocks")
    max_q = original(EAGER, "MAX_Q")

    def by_reciprocal(y, fmt, block, round_sf, clamp_min):
        sf = scales(y, fmt, block, round_sf, clamp_min)
        if round_sf:  # the power of two is taken from amax itself: no rounding to change
            return sf
        a = torch.clamp_min(blocks(y, block).abs().amax(dim=-1), clamp_min)
        reciprocal = torch.tensor(1.0 / max_q[fmt], dtype=torch.float32)
        return torch.where(torch.isnan(sf), sf, a * reciprocal)

    return patched(fn, EAGER, _scales=by_reciprocal)


def model_sf_by_reciprocal(cast: Callable[..., Any]) -> Callable[..., Any]:
    """Any per-token cast without round_sf, its fp32 sf replaced by fl(a * fl(1 / max_q)) (a = max(amax,
    clamp_min), exact) wherever that differs from the sf it returned, written back into its own sf tensor,
    and those blocks' data re-quantised with that sf by correct rounding (the reference encoder): a kernel
    that multiplies by the reciprocal and quantises with the sf it computed, as `eager_sf_by_reciprocal`.
    Blocks whose sf the kernel got some other way are left alone, so only that one rounding differs."""

    def broken(x: torch.Tensor, fmt: str = "e4m3", num_per_channels: int = 128, **options: Any) -> Any:
        data, sf = cast(x, fmt, num_per_channels, **options)
        if options.get("round_sf", False) or x.shape[0] == 0 or sf.dtype != torch.float32:
            return data, sf
        block, x64, values, a = _token_blocks(x, sf, fmt, num_per_channels, options.get("clamp_min"))
        with np.errstate(invalid="ignore", over="ignore"):
            by_reciprocal = (a.astype(np.float32) * np.float32(1.0 / ref.MAX_Q[fmt])).astype(np.float64)
        changed = np.isfinite(values) & np.isfinite(by_reciprocal) & (by_reciprocal != values)
        if not changed.any():
            return data, sf
        new_sf = np.where(changed, by_reciprocal, values)
        sf.copy_(ref.store_sf(new_sf).to(sf.device).reshape(sf.shape))
        new_codes = ref.encode_elements(ref.quotients(x64, new_sf, block), fmt)
        rows_changed = ref.expand_to_elements(changed, tuple(x.shape), block)
        codes = np.where(rows_changed, new_codes, ref.data_codes(data, fmt))
        return ref.pack_data(codes, fmt).to(data.device), sf

    return broken


# -- swiglu -----------------------------------------------------------------------------------------


def one_sided_clamp(swiglu: Callable[..., Any]) -> Callable[..., Any]:
    """SwiGLU whose r is clamped from above only (r = min(r, c), not clamp(r, -c, c)).

    Modelled with the implementation itself: its data and sf from the call on x with
    l = min(l, c) and r = min(r, c) applied beforehand and clamp=None; its counter from the
    call as given (the counting is not what this bug breaks).  Exact where c is
    representable in x's dtype (the strategy's 0.5, 7 and 10 are).
    """

    def broken(**kwargs: Any) -> Any:
        data, sf, count = swiglu(**kwargs)
        clamp = kwargs.get("clamp")
        if clamp is None:
            return data, sf, count
        x = kwargs["x"]
        c = float(torch.tensor(float(clamp), dtype=torch.float32))
        clamped = x.float().clamp_max(c).to(x.dtype)  # l = min(l, c) and r = min(r, c); NaN stays NaN
        data, sf, _ = swiglu(**{**kwargs, "x": clamped.contiguous(), "clamp": None})
        return data, sf, count

    return broken


def counter_low_word(swiglu: Callable[..., Any]) -> Callable[..., Any]:
    """clamped_count updated by a 32-bit add on the low word of each int64 entry: a carry out of
    the low 32 bits is lost (an atomicAdd on a 32-bit pointer into the int64 counter)."""

    def broken(**kwargs: Any) -> Any:
        data, sf, after = swiglu(**kwargs)
        before = kwargs.get("clamped_count")
        if before is None or after.numel() == 0:
            return data, sf, after
        before = before.to(after.device)
        low = ((before & 0xFFFFFFFF) + (after - before)) & 0xFFFFFFFF
        return data, sf, (before & ~0xFFFFFFFF) | low

    return broken


def swiglu_padding_unwritten(swiglu: Callable[..., Any]) -> Callable[..., Any]:
    """SwiGLU that skips the padding rows (pos_to_token_topk == -1) instead of writing +0 codes
    and the sf of a zero block: its data and sf keep only the other rows, in torch.empty buffers of
    the same layout (`unwritten_rows`), as a kernel that returns early on a padding row leaves
    them.  Without pos_to_token_topk there is no padding and nothing changes."""

    def broken(**kwargs: Any) -> Any:
        data, sf, count = swiglu(**kwargs)
        pos = kwargs.get("pos_to_token_topk")
        if pos is None:
            return data, sf, count
        live = pos >= 0
        return unwritten_rows(data, live), unwritten_rows(sf, live), count

    return broken


# -- the catalogue ---------------------------------------------------------------------------------

_ROUNDING = {
    "toward_zero": "rounds {fmt} codes towards zero (truncation) instead of to nearest, ties to even",
    "ties_away": "rounds {fmt} ties away from zero instead of to even",
}

MUTANTS = [
    *(Mutant(f"truncation_{fmt}", "quant.per_token_cast", _ROUNDING["toward_zero"].format(fmt=fmt),
             eager=eager_rounding(fmt, "toward_zero"), model=model_rounding(fmt, "toward_zero"))
      for fmt in ("e4m3", "e2m1", "e5m6")),
    *(Mutant(f"ties_away_{fmt}", "quant.per_token_cast", _ROUNDING["ties_away"].format(fmt=fmt),
             eager=eager_rounding(fmt, "ties_away"), model=model_rounding(fmt, "ties_away"))
      for fmt in ("e4m3", "e2m1", "e5m6")),
    Mutant("no_saturation_e4m3", "quant.per_token_cast_with_precomputed_sf",
           "e4m3 quotients beyond 448 (past the 464 midpoint) overflow to NaN instead of saturating to +-448",
           eager=eager_rounding("e4m3", "no_saturation"), model=model_rounding("e4m3", "no_saturation", True)),
    Mutant("sf_rounded_down", "quant.per_token_cast",
           "round_sf takes 2^floor(log2(amax / max_q)) instead of 2^ceil (the block then saturates)",
           eager=eager_sf_rounded_down, model=model_sf_rounded_down),
    Mutant("clamp_min_ignored", "quant.per_token_cast",
           "amax is not clamped to clamp_min before the sf is taken",
           eager=eager_clamp_min_ignored, model=model_clamp_min_ignored),
    Mutant("sf_by_reciprocal", "quant.per_token_cast",
           "the fp32 sf is amax * fp32(1 / max_q), one rounding more than amax / max_q (inside the contract's "
           "window, beyond the claims)",
           eager=eager_sf_by_reciprocal, model=model_sf_by_reciprocal, claim_regression=True),
    Mutant("swiglu_clamp_one_sided", "quant.swiglu_forward_and_per_token_cast",
           "the SwiGLU clamp bounds r from above only (r = min(r, c)), not to [-c, c]",
           model=one_sided_clamp),
    Mutant("swiglu_padding_rows_unwritten", "quant.swiglu_forward_and_per_token_cast",
           "the padding rows (pos_to_token_topk == -1) of data and sf are left unwritten instead of zero codes "
           "and a zero block's sf",
           model=swiglu_padding_unwritten),
    Mutant("swiglu_counter_32bit", "quant.swiglu_forward_and_per_token_cast",
           "clamped_count is added to in 32 bits: a carry out of the low word is lost",
           model=counter_low_word),
]
