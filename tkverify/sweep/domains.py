"""The inputs the sweeps run through: every fp32 bit pattern, every bf16 and fp16 code, every code
of an element format, and the set of scale factors.

Why the float64 oracle rounds these quotients as the exact ones
----------------------------------------------------------------
The oracle encodes Q = x / sf computed as one float64 division (relative error at most 2^-53)
and rounds it with `references.encode` (exact).  That equals rounding the exact quotient as long
as fl(Q) lies on the same side of every rounding boundary m of the target format as Q does, and
equals m where Q does:

* fp32 sweep: sf = 1, so Q = x exactly (every fp32 is a float64).
* bf16 and fp16 sweeps: x has at most 11 significant bits (fp16; bf16 has 8), sf 24 (an fp32), and
  a boundary m (a value of the format, or the midpoint of two neighbours) at most 8 (e5m6: 7 bits
  of significand and one more for a midpoint; e4m3 5, e2m1 3), so the product m sf has at most 32.
  Let Q != m, so d = x - m sf != 0.  Both x and m sf are integer multiples of 2^t, the lower of
  their two last places, so |d| >= 2^t.  The relative gap |Q - m| / |Q| is |d| / |x|.  If 2^t is
  x's last place, |x| < 2^(t + 11) and the gap exceeds 2^-11.  If it is the product's, |m sf| <
  2^(t + 32); either |d| >= |m sf| / 2 (a gap of at least 1/3) or |x| < 1.5 |m sf|, and the gap
  exceeds 2^-32 / 1.5 > 2^-33.  The float64 division returns Q (1 + e) with |e| <= 2^-53, which
  is on the same side of m as Q; when Q = m, m is a float64 and the division is exact.  The
  subnormal ranges of the target format only lower the bits of m, and saturation's edge (the
  largest value plus half its last place) is such a midpoint too.  tests/test_sweep.py checks
  this against `fractions.Fraction` on sampled pairs, on boundaries and one input ULP off them.
* cast_back: q * sf has at most 8 + 24 bits, so the float64 product is exact, and is rounded
  once to bf16 or fp32 by the encoder.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import torch

import references.quant as ref

FP32_PATTERNS = 1 << 32
CODES_16 = 1 << 16
ROW = 4096  # elements a row of a sweep's tensor, when there are that many
BLOCK = 128  # num_per_channels of e4m3 and e2m1 in the sweeps (e5m6: the whole row)
POWER_OF_TWO_RANGE = range(-10, 11)
BINADE_EDGE_EXPONENTS = (-6, 0, 6)
SUBNORMAL_SF_BITS = (0x00000001, 0x00123457)  # the smallest fp32 subnormal, and one that is not a power of two


@dataclasses.dataclass(frozen=True)
class ScaleFactor:
    value: float  # an fp32 value, held as a float64
    kind: str  # "one", "power of two", "binade edge", "subnormal", "clamp", "drawn"


def _fp32(v: float) -> float:
    return float(np.float32(v))


def _fp32_of_bits(bits: int) -> float:
    return float(np.array([bits], dtype=np.uint32).view(np.float32)[0])


def drawn_scale_factors(count: int, seed: int) -> list[float]:
    """`count` fp32 values from numpy.random.default_rng(seed): a random significand, exponent in [-20, 20]."""
    rng = np.random.default_rng(seed)
    exponent = rng.integers(127 - 20, 127 + 21, size=count).astype(np.uint32)
    mantissa = rng.integers(0, 1 << 23, size=count).astype(np.uint32)
    return [_fp32_of_bits(int(b)) for b in (exponent << 23) | mantissa]


def scale_factors(fmt: str, drawn: int, seed: int) -> list[ScaleFactor]:
    """The sf of the bf16, fp16 and cast_back sweeps for `fmt`, without repeats.

    The first three are 1, the sf of a block whose amax sits at the contract's clamp
    (fp32(clamp_min) / max_q, stored as fp32), and the first drawn one, so that a short
    prefix (`--sf-limit 3`) already holds a power of two, the clamp and an arbitrary sf.
    Then: the powers of two 2^-10..2^10; the amax at binade edges (2^k and the largest bf16
    below 2^(k+1)) divided by the format's largest value, as fp32 (the plain sf a cast
    computes for them); two subnormal fp32 sf; the other drawn ones.
    """
    max_q = ref.MAX_Q[fmt]
    clamp = _fp32(ref.clamp_min_value(fmt) / max_q)
    drawn_values = drawn_scale_factors(drawn, seed)
    candidates = [ScaleFactor(1.0, "one"), ScaleFactor(clamp, "clamp")]
    candidates += [ScaleFactor(v, "drawn") for v in drawn_values[:1]]
    candidates += [ScaleFactor(2.0**k, "power of two") for k in POWER_OF_TWO_RANGE]
    for k in BINADE_EDGE_EXPONENTS:
        for amax in (2.0**k, (2 - 2.0**-7) * 2.0**k):
            candidates.append(ScaleFactor(_fp32(amax / max_q), "binade edge"))
    candidates += [ScaleFactor(_fp32_of_bits(b), "subnormal") for b in SUBNORMAL_SF_BITS]
    candidates += [ScaleFactor(v, "drawn") for v in drawn_values[1:]]
    seen, out = set(), []
    for sf in candidates:
        if sf.value not in seen:
            seen.add(sf.value)
            out.append(sf)
    return out


def row_layout(count: int) -> tuple[int, int]:
    """(rows, H) of a tensor holding `count` elements, padded to whole rows: H = ROW, or for fewer
    elements the count rounded up to a multiple of BLOCK (num_per_channels must divide H)."""
    width = ROW if count >= ROW else max(BLOCK, -(-count // BLOCK) * BLOCK)
    return -(-count // width), width


def fp32_patterns(start: int, stop: int, device: torch.device) -> torch.Tensor:
    """The fp32 values of bit patterns start..stop-1 (int64 range), flat."""
    return torch.arange(start, stop, dtype=torch.int64, device=device).to(torch.int32).view(torch.float32)


def codes_16(dtype: torch.dtype, count: int, device: torch.device) -> torch.Tensor:
    """The values of the first `count` codes 0, 1, ... of a 16-bit float dtype (bf16 or fp16), flat."""
    return torch.arange(count, dtype=torch.int64, device=device).to(torch.int16).view(dtype)


def padded_rows(flat: torch.Tensor, rows: int, width: int) -> torch.Tensor:
    """`flat` in a (rows, width) tensor, the elements past it +0."""
    out = torch.zeros(rows * width, dtype=flat.dtype, device=flat.device)
    out[: flat.numel()] = flat
    return out.reshape(rows, width)
