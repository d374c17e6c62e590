"""The quantisation family: casts to e4m3 / e2m1 / e5m6 with block scale factors,
cast_back, and SwiGLU fused with a per-token cast (OPS.md: "Number formats",
"Scale factors", "quant").

How each output is judged
-------------------------
Every output's policy is decided per case by the spec's ``given`` (the format,
storage and bound depend on the case's parameters), and carried to the
`Decided` policy below as a `Judgement`.  Malformed outputs (dtype, shape,
contiguity, the TMA-aligned column-major layout, non-zero padding bytes of a
packed ue8m0 sf) fail with a message that names the problem.

data (every cast)
    Judged *given the implementation's own sf*: the exact quotient
    Q = x / sf_impl (float64) must round (RNE, satfinite) to the stored code.
    A kernel works in fp32, and one fp32 rounding of the quotient (IEEE
    division: <= 2^-24 relative; multiplying by a rounded reciprocal: < 2^-23;
    an approximate division such as div.approx.f32: <= 2 ULP, 2^-22) can carry
    Q across a rounding boundary of the format (a double rounding).  So an
    element may also take the code of Q * (1 +- 2^-22) (`CAST_WINDOW`): a
    neighbouring code, and only where Q lies within 2^-22 of a boundary.  Where
    sf_impl is a power of two (round_sf, ue8m0, or by chance) the quotient is
    exact in any precision and the window is 0: the code must be the correctly
    rounded one.  Truncation and an sf off by an ULP fail at once; ties-away
    fails where a quotient is exactly a tie and sf is a power of two (with a
    plain sf the window rightly accepts either neighbour of a tie).
    A block whose sf is NaN: every element must be NaN, except in e2m1 (which
    has no NaN) where the codes are unconstrained (not judged, counted as
    agreeing): the NaN sf already makes the block dequantise to NaN.
    clamp_min is the fp32 nearest the number given (1e-4 is 1.00000005e-4).
    A precomputed sf (any storage: fp32, ue8m0 bytes, packed ue8m0; any
    strides) is used as given, with IEEE division: sf = 0 gives +-inf (e5m6
    keeps it, e4m3 and e2m1 saturate to +-max), 0 / 0 is NaN; the judge
    applies the same rule with that sf.

sf (every cast)
    Against the oracle's sf from the exact amax.  round_sf, ue8m0 and packed
    ue8m0 are exact (a power of two found by exact comparison): within
    [sf, sf].  Plain fp32 sf = a / max_q: within 1.5 ULP (`SF_PLAIN_ULP`) of the
    exact quotient.  A correctly rounded division is <= 0.5 ULP; a kernel that
    multiplies by fl(1 / max_q) adds the reciprocal's error (< 2^-24 relative,
    i.e. < 1 ULP of the result), hence 1.5 (exhaustively over fp32 significands
    the worst is 8/7 ULP, for 448; torch on CUDA divides a tensor by a scalar
    this way and was seen at 1.14).  Non-finite blocks: NaN (0xFF).

out (cast_back)
    Bitwise against the exact product q * sf rounded once to out_dtype
    (NaNs of any payload agree; signed zeros count).  IEEE overflow: a code
    can dequantise past the fp32 range (bf16's largest value with round_sf
    becomes 256 * 2^120 = 2^128), and then the correctly rounded result is inf.

swiglu_forward_and_per_token_cast
    y = l * sigmoid(l) * r * w is computed by a kernel in fp32, so its y is not
    the float64 y.  Error budget for an fp32 evaluation: exp <= 2 ULP, the add
    0.5, the reciprocal or division 1.5, three products 1.5, the quotient by
    sf 1.5: about 7 ULP (< 2^-20 relative); the declared relative bound is
    `SWIGLU_WINDOW` = 2^-18 (32 ULP; a fast-math __expf, whose error grows as
    1.17 |l| ULP, overruns it for |l| beyond ~25 and is meant to be reported).
    Below the normal fp32 range that relative bound cannot hold (sigmoid
    underflows to 0 or to subnormals - torch's does below l ~ -88 - and
    flush-to-zero kernels drop subnormal intermediates), so each element also
    gets an absolute allowance 2^-125 (1 + |l|)(1 + |r|)(1 + |w|): one
    flushed intermediate of at most 2^-126 carried through the remaining
    factors, for any order of the products.  With y's range so bounded:
    data must round a value in [Q - d, Q + d] (d = the bound over sf_impl) and
    the sf must lie between the sf of the smallest and of the largest amax
    the bound allows (plain sf: with 1.5 ULP either side).  clamped_count is
    bitwise: int64 counts, exact.
    Above the fp32 range: an element whose inputs are finite but for which
    some fp32 evaluation order can overflow (max(1,|l|) max(1,|r|) max(1,|w|)
    > the largest fp32) is unconstrained, and so is its block's sf: an fp32
    kernel may get inf, or inf * 0 = NaN where the exact y is finite (found by
    the suite: w = 0 with |l r| ~ 1e75).  The other elements of such a block
    are still judged given whatever sf the kernel wrote (NaN sf: NaN codes).
    Padding rows (pos_to_token_topk == -1) are *written*, as if y were 0:
    codes +0 (any signed zero agrees) and the sf of an all-zero block
    (clamp_min / max_q, or its power of two); their x is never read (a NaN there
    changes nothing) and they are not counted in clamped_count.  Writing them
    rather than skipping them makes the output deterministic, and "sf = 0"
    would have no ue8m0 encoding.
    Non-finite values follow IEEE arithmetic: l = -inf gives -inf * 0 = NaN,
    and a NaN or an infinite y (also one past the fp32 range) makes its
    block's sf NaN.  The clamp never turns a NaN into a number.
    The public function updates clamped_count in place; the spec wraps it
    (`ReturningClampedCount`) so that the counter after the call is judged as
    a third output (empty when the call had none).
"""

from __future__ import annotations

import dataclasses
import importlib
import math
from typing import Any, Callable

import numpy as np
import torch

import references.quant as ref
import strategies.quant
from tkverify import benchshapes, formats
from tkverify.policies import Bracket, Comparison, Policy, bitwise, within
from tkverify.registry import BenchShape, OpSpec, register, tilelang_impl, torch_impl

CAST_WINDOW = 2.0**-22
SWIGLU_WINDOW = 2.0**-18
SWIGLU_ABSOLUTE = 2.0**-125
SF_PLAIN_ULP = 1.5

_DATA_DTYPES = {"e4m3": torch.float8_e4m3fn, "e2m1": torch.int8, "e5m6": torch.uint8}


# -- a policy decided per case ------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Judgement:
    """What `given` decided for one output: the policy, the (prepared) actual value and
    the expected one; or `error`, a malformed output that fails with that message."""

    policy: Policy | None = None
    actual: Any = None
    expected: Any = None
    error: str | None = None
    fmt: str = ""


@dataclasses.dataclass(frozen=True)
class Decided(Policy):
    """The policy that the spec's `given` chooses per case (format, storage and bound
    depend on the case); ``describe`` says what it checks."""

    describe: str

    def compare(self, output: str, actual: Any, expected: Any) -> Comparison:
        if not isinstance(expected, Judgement):
            raise TypeError(f"output {output!r} is judged through the spec's given(), which returned "
                            f"{type(expected).__name__}")
        if expected.error is not None:
            return Comparison(output, expected.fmt, "layout", 0, 0, math.inf, 0.0, {}, False,
                              message=f"output {output!r}: {expected.error}")
        return expected.policy.compare(output, expected.actual, expected.expected)


def _malformed(message: str, fmt: str) -> Judgement:
    return Judgement(error=message, fmt=fmt)


# -- checking what an implementation returned ----------------------------------------------


def _data_problem(data: Any, fmt: str, shape: tuple[int, int]) -> str | None:
    num_rows, hidden = shape
    width = {"e4m3": hidden, "e2m1": hidden // 2, "e5m6": 3 * hidden // 2}[fmt]
    if not isinstance(data, torch.Tensor):
        return f"expected a tensor, got {type(data).__name__}"
    if data.dtype != _DATA_DTYPES[fmt]:
        return f"{fmt} data must be {_DATA_DTYPES[fmt]}, got {data.dtype}"
    if tuple(data.shape) != (num_rows, width):
        return f"{fmt} data of x {shape} must have shape {(num_rows, width)}, got {tuple(data.shape)}"
    if not data.is_contiguous():
        return f"data must be contiguous, got strides {data.stride()}"
    return None


def _sf_problem(sf: Any, rows: int, cols: int, use_ue8m0: bool, use_packed_ue8m0: bool,
                col_major: bool) -> str | None:
    """What is wrong with a returned sf's dtype, shape, layout or packing padding (None if nothing)."""
    dtype = ref.sf_storage_dtype(use_ue8m0, use_packed_ue8m0)
    stored_cols = ref.packed_sf_cols(cols) if use_packed_ue8m0 else cols
    if not isinstance(sf, torch.Tensor):
        return f"expected a tensor, got {type(sf).__name__}"
    if sf.dtype != dtype:
        return f"sf must be {dtype} with these options, got {sf.dtype}"
    if tuple(sf.shape) != (rows, stored_cols):
        return f"sf must have shape {(rows, stored_cols)}, got {tuple(sf.shape)}"
    if sf.numel() == 0:
        return None  # an empty tensor has no layout to speak of
    if col_major:
        padded = ref.tma_padded_rows(rows, dtype)
        if rows > 1 and sf.stride(0) != 1:
            return (f"TMA-aligned column-major sf must have stride(0) == 1, got strides {sf.stride()} "
                    f"for shape {tuple(sf.shape)}")
        if stored_cols > 1 and sf.stride(1) != padded:
            return (f"TMA-aligned column-major sf must have stride(1) == {padded} (rows={rows} padded to a "
                    f"multiple of {ref.TMA_ALIGN_BYTES} bytes), got strides {sf.stride()}")
    elif not sf.is_contiguous():
        return f"sf must be row-major contiguous, got strides {sf.stride()} for shape {tuple(sf.shape)}"
    if use_packed_ue8m0 and cols % 4 and rows:
        raw = sf.detach().cpu().contiguous().numpy()
        bytes_ = np.asarray(formats.unpack_ue8m0(raw)).reshape(rows, 4 * stored_cols)
        if np.any(bytes_[:, cols:]):
            return f"the padding bytes past column {cols} of a packed ue8m0 sf must be 0"
    return None


# -- expected values ----------------------------------------------------------------------


def _unconstrained(bracket: Bracket, where: np.ndarray, actual_values: np.ndarray) -> Bracket:
    """The bracket with the elements `where` left unconstrained ([-inf, inf], NaN included).

    Their exact value is taken to be the actual one, so that they count as
    agreeing in the report instead of inflating its ULP figures.
    """
    return Bracket(np.where(where, actual_values, bracket.exact), np.where(where, -np.inf, bracket.low),
                   np.where(where, np.inf, bracket.high))


def _element_bracket(q: np.ndarray, slack: np.ndarray, fmt: str, actual_codes: np.ndarray) -> Bracket:
    """The codes a value in [q - slack, q + slack] rounds to (RNE_sat), as a Bracket.

    NaN quotients must stay NaN; in e2m1 (no NaN) they are unconstrained.
    """
    f = formats.get(fmt)
    nan = np.isnan(q)
    finite_slack = np.where(np.isfinite(q) & np.isfinite(slack), slack, 0.0)
    safe = np.where(nan, 0.0, q)
    low = f.decode(f.encode(safe - finite_slack))
    high = f.decode(f.encode(safe + finite_slack))
    bracket = Bracket(q, np.where(nan, np.nan, low), np.where(nan, np.nan, high))
    if f.has_nan:
        return bracket
    return _unconstrained(bracket, nan, f.decode(actual_codes))


def _sf_bracket(a_low: np.ndarray, a_exact: np.ndarray, a_high: np.ndarray, fmt: str, round_sf: bool) -> Bracket:
    """The sf values allowed for clamped amax anywhere in [a_low, a_high] (exact: a_exact)."""
    exact = ref.scale_from_amax(a_exact, fmt, round_sf)
    low = ref.scale_from_amax(a_low, fmt, round_sf)
    high = ref.scale_from_amax(a_high, fmt, round_sf)
    if not round_sf:
        low = low - SF_PLAIN_ULP * formats.FP32.ulp(low)
        high = high + SF_PLAIN_ULP * formats.FP32.ulp(high)
    nan = np.isnan(exact)
    high = np.where(np.isnan(high), np.inf, high)  # a finite amax whose error bound reaches past fp32
    return Bracket(exact, np.where(nan, np.nan, low), np.where(nan, np.nan, high))


@dataclasses.dataclass
class _Cast:
    """One cast as the judge sees it: the values quantised and the options."""

    values: np.ndarray  # float64 (T, H): x, or swiglu's y
    fmt: str
    block: tuple[int, int]
    round_sf: bool = False
    use_ue8m0: bool = False
    use_packed_ue8m0: bool = False
    col_major: bool = False
    clamp_min: float | None = None
    # swiglu: the absolute error bound of each value (None: values are exact inputs)
    value_error: np.ndarray | None = None
    padding: np.ndarray | None = None  # rows written as zero
    # swiglu: elements whose fp32 evaluation may overflow (any value, NaN included, is accepted)
    unconstrained: np.ndarray | None = None

    @property
    def grid(self) -> tuple[int, int]:
        return ref.sf_grid(*self.values.shape, self.block)

    def amax_range(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Clamped amax: lowest, exact and highest the declared value error allows."""
        cm = ref.clamp_min_value(self.fmt, self.clamp_min)
        exact = np.maximum(ref.block_amax(self.values, self.block), cm)
        if self.value_error is None:
            return exact, exact, exact
        magnitude = np.abs(self.values)
        with np.errstate(invalid="ignore", over="ignore"):
            low = np.maximum(magnitude - self.value_error, 0.0)
            high = magnitude + self.value_error
        return (np.maximum(ref.block_amax(low, self.block), cm), exact,
                np.maximum(ref.block_amax(high, self.block), cm))

    def oracle_sf(self) -> np.ndarray:
        return ref.stored_scales(ref.scale_from_amax(self.amax_range()[1], self.fmt, self.round_sf))

    def unconstrained_blocks(self) -> np.ndarray:
        """Blocks holding an unconstrained element: their sf is unconstrained too."""
        if self.unconstrained is None:
            return np.zeros(self.grid, dtype=bool)
        return ref.block_amax(self.unconstrained.astype(np.float64), self.block) > 0

    def judge_sf(self, sf: Any) -> tuple[Judgement, np.ndarray | None]:
        """The sf's judgement, and its logical values (None when it is malformed)."""
        rows, cols = self.grid
        sf_fmt = "ue8m0" if self.use_ue8m0 else "fp32"
        problem = _sf_problem(sf, rows, cols, self.use_ue8m0, self.use_packed_ue8m0, self.col_major)
        if problem is not None:
            return _malformed(problem, sf_fmt), None
        values = ref.sf_logical_values(sf, cols)
        expected = _unconstrained(_sf_bracket(*self.amax_range(), self.fmt, self.round_sf),
                                  self.unconstrained_blocks(), values)
        if self.use_ue8m0:
            codes = ref.ue8m0_codes(values)  # exact: the values are decoded ue8m0 bytes
            return Judgement(within("ue8m0"), codes, expected), values
        return Judgement(within("fp32"), sf, expected), values

    def judge_data(self, data: Any, sf_values: np.ndarray | None) -> Judgement:
        """The data's judgement given sf_values (the implementation's sf; the oracle's if that is malformed).

        The slack around each quotient: for exact inputs, CAST_WINDOW relative
        unless the sf is a power of two; for swiglu, y's error bound over |sf|.
        """
        problem = _data_problem(data, self.fmt, self.values.shape)
        if problem is not None:
            return _malformed(problem, self.fmt)
        if sf_values is None:
            sf_values = self.oracle_sf()
        codes = ref.data_codes(data, self.fmt)
        q = ref.quotients(self.values, sf_values, self.block)
        sf_elements = ref.expand_to_elements(sf_values, self.values.shape, self.block)
        with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
            if self.value_error is None:
                slack = np.where(ref.is_power_of_two(sf_elements), 0.0, CAST_WINDOW) * np.abs(q)
            else:
                slack = self.value_error / np.abs(sf_elements)
        bracket = _element_bracket(q, slack, self.fmt, codes)
        if self.unconstrained is not None:
            bracket = _unconstrained(bracket, self.unconstrained, formats.get(self.fmt).decode(codes))
        if self.padding is not None and self.padding.any():
            rows = self.padding[:, None]
            bracket = Bracket(*(np.where(rows, 0.0, v) for v in (bracket.exact, bracket.low, bracket.high)))
        return Judgement(within(self.fmt), codes, bracket)


def _sf_flags(params: dict[str, Any]) -> dict[str, Any]:
    return {
        "round_sf": params.get("round_sf", False),
        "use_ue8m0": params.get("use_ue8m0", False),
        "use_packed_ue8m0": params.get("use_packed_ue8m0", False),
        "col_major": params.get("use_tma_aligned_col_major_sf", False),
        "clamp_min": params.get("clamp_min"),
    }


def _cast_of(case, block: tuple[int, int]) -> _Cast:
    return _Cast(ref.as_float64(case.inputs["x"]), case.params.get("fmt", "e4m3"), block, **_sf_flags(case.params))


def _given_cast(block_of: Callable[[dict[str, Any]], tuple[int, int]]):
    def given(case, actual: dict[str, Any]) -> dict[str, Judgement]:
        cast = _cast_of(case, block_of(case.params))
        sf_judgement, sf_values = cast.judge_sf(actual["sf"])
        return {"sf": sf_judgement, "data": cast.judge_data(actual["data"], sf_values)}
    return given


def _given_sf_only(case, actual: dict[str, Any]) -> dict[str, Judgement]:
    cast = _cast_of(case, (1, case.params.get("num_per_channels", 128)))
    return {"sf": cast.judge_sf(actual["sf"])[0]}


def _given_precomputed(case, actual: dict[str, Any]) -> dict[str, Judgement]:
    params = case.params
    cast = _Cast(ref.as_float64(case.inputs["x"]), params.get("fmt", "e4m3"), (1, params.get("num_per_channels", 128)))
    given_sf = ref.sf_logical_values(case.inputs["sf"], cast.grid[1])
    return {"data": cast.judge_data(actual["data"], given_sf)}


def _given_cast_back(case, actual: dict[str, Any]) -> dict[str, Judgement]:
    params = case.params
    dtype = ref.out_dtype_of(params.get("out_dtype", torch.bfloat16))
    exact = ref.dequantised(case.inputs["data"], case.inputs["sf"], params.get("fmt", "e4m3"),
                            tuple(params.get("block", (1, 128))))
    out = actual["out"]
    fmt = formats.of_dtype(dtype).name
    if not isinstance(out, torch.Tensor) or out.dtype != dtype:
        return {"out": _malformed(f"out must be a {dtype} tensor, got {getattr(out, 'dtype', type(out).__name__)}",
                                  fmt)}
    if not out.is_contiguous():
        return {"out": _malformed(f"out must be contiguous, got strides {out.stride()}", fmt)}
    return {"out": Judgement(bitwise(dtype), out, exact)}


def _swiglu_value_error(y: np.ndarray, l: np.ndarray, r: np.ndarray, w: np.ndarray) -> np.ndarray:
    """Absolute error bound of an fp32 y (see the module docstring)."""
    with np.errstate(invalid="ignore", over="ignore"):
        floor = SWIGLU_ABSOLUTE * (1 + np.abs(l)) * (1 + np.abs(r)) * (1 + np.abs(w))[:, None]
        return SWIGLU_WINDOW * np.abs(y) + floor


def _may_overflow_fp32(l: np.ndarray, r: np.ndarray, w: np.ndarray) -> np.ndarray:
    """Finite elements some fp32 evaluation order of l * sigmoid(l) * r * w can overflow.

    Every intermediate product is at most max(1,|l|) max(1,|r|) max(1,|w|)
    (sigmoid <= 1); below the fp32 range no order overflows.  Infinite inputs
    are not included: IEEE gives them the same inf or NaN in every order.
    """
    w = w[:, None]
    with np.errstate(over="ignore", invalid="ignore"):
        biggest = np.maximum(1, np.abs(l)) * np.maximum(1, np.abs(r)) * np.maximum(1, np.abs(w))
    finite = np.isfinite(l) & np.isfinite(r) & np.isfinite(w)
    return finite & (biggest > formats.FP32.max_finite)


def _given_swiglu(case, actual: dict[str, Any]) -> dict[str, Judgement]:
    params, inputs = case.params, case.inputs
    y, l, r, w, padding, counts = ref.swiglu_rows(inputs["x"], inputs.get("topk_weights"),
                                                  inputs.get("pos_to_token_topk"), params.get("clamp"))
    y = ref.fp32_range(y)
    error = np.where(padding[:, None], 0.0, _swiglu_value_error(y, l, r, w))
    overflow = _may_overflow_fp32(l, r, w) & ~padding[:, None]
    cast = _Cast(y, params.get("fmt", "e4m3"), (1, params.get("num_per_channels", 128)), **_sf_flags(params),
                 value_error=error, padding=padding, unconstrained=overflow)
    sf_judgement, sf_values = cast.judge_sf(actual["sf"])
    data_judgement = cast.judge_data(actual["data"], sf_values)
    expected_count = ref.updated_count(inputs.get("clamped_count"), counts)
    count = actual["clamped_count"]
    if not isinstance(count, torch.Tensor) or count.dtype != torch.int64:
        count_judgement = _malformed(f"clamped_count must stay an int64 tensor, got {count!r}", "int64")
    else:
        count_judgement = Judgement(bitwise(torch.int64), count, expected_count.numpy())
    return {"data": data_judgement, "sf": sf_judgement, "clamped_count": count_judgement}


# -- the swiglu counter as an output ------------------------------------------------------------------


class ReturningClampedCount:
    """Calls a swiglu implementation (a callable, or an import path resolved on first use) and
    returns (data, sf, clamped_count after the call), so that the in-place
    counter is judged like an output.  The counter is copied first: on the CPU
    the case's own tensor would otherwise be updated before the oracle reads it.
    """

    def __init__(self, target: str | Callable[..., Any]):
        self.target = target
        self._fn: Callable[..., Any] | None = target if callable(target) else None

    def __repr__(self) -> str:
        return f"ReturningClampedCount({self.target!r})"

    def __call__(self, **kwargs: Any):
        if self._fn is None:
            module, _, attr = self.target.partition(":")
            self._fn = getattr(importlib.import_module(module), attr)
        count = kwargs.get("clamped_count")
        if count is not None:
            kwargs["clamped_count"] = count.clone()
        data, sf = self._fn(**kwargs)
        after = kwargs["clamped_count"] if count is not None else torch.empty(0, dtype=torch.int64,
                                                                              device=kwargs["x"].device)
        return data, sf, after


# -- the registry entries -------------------------------------------------------------------------------

_DATA_POLICY = Decided(
    "the code of x / sf_impl (float64) rounded RNE_sat; a neighbour only where fp32 rounding of the quotient "
    "(relative 2^-22) can cross a rounding boundary, never when sf is a power of two; "
    "NaN blocks NaN (e2m1: unconstrained)"
)
_SF_POLICY = Decided(
    f"round_sf / ue8m0 / packed ue8m0: exact; plain fp32: within {SF_PLAIN_ULP:g} ULP of a / max_q; "
    "NaN for non-finite blocks; dtype, shape and layout (TMA column-major: stride(0) == 1, rows padded) checked"
)


def _impls(name: str, torch_target: Any = None, tilelang_target: Any = None) -> dict:
    return {
        "torch": torch_impl(torch_target or f"kernels.torch.quant:{name}"),
        "tilelang": tilelang_impl(tilelang_target or f"kernels.quant:{name}"),
    }


# -- benchmark shapes (tkverify bench) ------------------------------------------------------------------
# DeepSeek-V3's: activations bf16 (16384, 7168); SwiGLU input (16384, 2 x 2048).
_T, _H, _SWIGLU_H = 16384, 7168, 2048
_DATA_BYTES = {"e4m3": 1.0, "e2m1": 0.5, "e5m6": 1.5}  # bytes of data per element


def _x_shape(params):
    return lambda device: ({"x": benchshapes.randn((_T, _H), torch.bfloat16, device)}, dict(params))


def _cast_bytes(sf_rows, sf_cols):
    """x read + data written + an fp32 sf of sf_rows(T) x sf_cols(H, params) written."""
    def count(i, p):
        t, h = i["x"].shape
        return (benchshapes.nbytes(i["x"]) + int(t * h * _DATA_BYTES[p["fmt"]]) + sf_rows(t, p) * sf_cols(h, p) * 4)
    return count


def _cast_back_shape(device):
    g = benchshapes.generator(device, 3)
    data = torch.randint(0, 256, (_T, _H), dtype=torch.uint8, device=device, generator=g)
    data[(data & 0x7F) == 0x7F] = 0  # no NaN codes: a dequantisation of real data
    sf = torch.rand(_T, _H // 128, device=device, generator=g) + 0.5
    return ({"data": data.view(torch.float8_e4m3fn), "sf": sf},
            {"fmt": "e4m3", "block": [1, 128], "out_dtype": torch.bfloat16})


def _swiglu_shape(device):
    return ({"x": benchshapes.randn((_T, 2 * _SWIGLU_H), torch.bfloat16, device)},
            {"fmt": "e4m3", "num_per_channels": 128})


def _swiglu_bytes(i, p):
    n, h2 = i["x"].shape
    return benchshapes.nbytes(i["x"]) + n * h2 // 2 + n * (h2 // 2 // p["num_per_channels"]) * 4


def _swiglu_routed_shape(device):
    # a tenth of the rows padding (pos -1), weights gathered through pos_to_token_topk, clamp 7, counting
    inputs, params = _swiglu_shape(device)
    g = benchshapes.generator(device, 4)
    pos = torch.randperm(_T, device=device, generator=g).to(torch.int32)
    pos[torch.rand(_T, device=device, generator=g) < 0.1] = -1
    inputs.update(pos_to_token_topk=pos, topk_weights=torch.rand(_T // 8 + 1, 8, device=device, generator=g),
                  clamped_count=torch.zeros(3, dtype=torch.int64, device=device))
    return inputs, dict(params, clamp=7.0)


def _per_token(h, p):
    return h // p["num_per_channels"]


_X = f"T{_T} H{_H} bf16"
BENCH = {
    "quant.per_token_cast": (
        BenchShape(f"{_X} e4m3/128", _x_shape({"fmt": "e4m3", "num_per_channels": 128}),
                   _cast_bytes(lambda t, p: t, _per_token)),
        BenchShape(f"{_X} e2m1/32", _x_shape({"fmt": "e2m1", "num_per_channels": 32}),
                   _cast_bytes(lambda t, p: t, _per_token)),
        BenchShape(f"{_X} e5m6/H", _x_shape({"fmt": "e5m6", "num_per_channels": _H}),
                   _cast_bytes(lambda t, p: t, _per_token)),
        BenchShape(f"{_X} e4m3/128 round_sf packed ue8m0 tma", _x_shape(
            {"fmt": "e4m3", "num_per_channels": 128, "round_sf": True, "use_ue8m0": True, "use_packed_ue8m0": True,
             "use_tma_aligned_col_major_sf": True}),
            lambda i, p: benchshapes.nbytes(i["x"]) + i["x"].numel() + i["x"].shape[0] * (_H // 128 // 4) * 4),
    ),
    "quant.per_block_cast": (
        BenchShape(f"{_X} e4m3 128x128", _x_shape({"fmt": "e4m3", "block": [128, 128]}),
                   _cast_bytes(lambda t, p: -(-t // 128), lambda h, p: h // 128)),
    ),
    "quant.per_channel_cast": (
        BenchShape(f"{_X} e4m3 128x1", _x_shape({"fmt": "e4m3", "num_per_tokens": 128}),
                   _cast_bytes(lambda t, p: -(-t // p["num_per_tokens"]), lambda h, p: h)),
    ),
    "quant.cast_back": (
        BenchShape(f"T{_T} H{_H} e4m3/128 -> bf16", _cast_back_shape,
                   lambda i, p: benchshapes.nbytes(i["data"]) + benchshapes.nbytes(i["sf"]) + i["data"].numel() * 2),
    ),
    "quant.swiglu_forward_and_per_token_cast": (
        BenchShape(f"N{_T} 2x{_SWIGLU_H} bf16 e4m3/128", _swiglu_shape, _swiglu_bytes),
        BenchShape(f"N{_T} 2x{_SWIGLU_H} bf16 e4m3/128 weights clamp count", _swiglu_routed_shape,
                   lambda i, p: _swiglu_bytes(i, p) + i["x"].shape[0] * 8),
    ),
}


register(OpSpec(
    name="quant.per_token_cast",
    bench=BENCH.get("quant.per_token_cast", ()),
    oracle=ref.per_token_cast,
    strategy=strategies.quant.per_token_cast_cases,
    outputs={"data": _DATA_POLICY, "sf": _SF_POLICY},
    impls=_impls("per_token_cast"),
    given=_given_cast(lambda p: (1, p.get("num_per_channels", 128))),
    doc="x (T, H) in 1 x num_per_channels blocks -> (data, sf).",
))

register(OpSpec(
    name="quant.per_token_cast_with_sf_only",
    bench=BENCH.get("quant.per_token_cast_with_sf_only", ()),
    oracle=ref.per_token_cast_with_sf_only,
    strategy=strategies.quant.per_token_cast_cases,
    outputs={"sf": _SF_POLICY},
    impls=_impls("per_token_cast_with_sf_only"),
    given=_given_sf_only,
    doc="The sf of per_token_cast alone.",
))

register(OpSpec(
    name="quant.per_token_cast_with_precomputed_sf",
    bench=BENCH.get("quant.per_token_cast_with_precomputed_sf", ()),
    oracle=ref.per_token_cast_with_precomputed_sf,
    strategy=strategies.quant.precomputed_sf_cases,
    outputs={"data": _DATA_POLICY},
    impls=_impls("per_token_cast_with_precomputed_sf"),
    given=_given_precomputed,
    doc="The data of x quantised with a given sf (fp32, ue8m0 or packed ue8m0): q = RNE_sat(x / sf).",
))

register(OpSpec(
    name="quant.per_block_cast",
    bench=BENCH.get("quant.per_block_cast", ()),
    oracle=ref.per_block_cast,
    strategy=strategies.quant.per_block_cast_cases,
    outputs={"data": _DATA_POLICY, "sf": _SF_POLICY},
    impls=_impls("per_block_cast"),
    given=_given_cast(lambda p: tuple(p.get("block", (128, 128)))),
    doc="x (T, H) in bm x bk blocks -> (data, sf (ceil(T/bm), H/bk)).",
))

register(OpSpec(
    name="quant.per_channel_cast",
    bench=BENCH.get("quant.per_channel_cast", ()),
    oracle=ref.per_channel_cast,
    strategy=strategies.quant.per_channel_cast_cases,
    outputs={"data": _DATA_POLICY, "sf": _SF_POLICY},
    impls=_impls("per_channel_cast"),
    given=_given_cast(lambda p: (p.get("num_per_tokens", 128), 1)),
    doc="x (T, H) in num_per_tokens x 1 blocks -> (data, sf (ceil(T/npt), H)).",
))

register(OpSpec(
    name="quant.cast_back",
    bench=BENCH.get("quant.cast_back", ()),
    oracle=ref.cast_back,
    strategy=strategies.quant.cast_back_cases,
    outputs={"out": Decided("bitwise against q * sf (exact) rounded once to out_dtype; dtype checked")},
    impls=_impls("cast_back"),
    given=_given_cast_back,
    doc="Dequantise: q * sf correctly rounded to bf16 or fp32.",
))

register(OpSpec(
    name="quant.swiglu_forward_and_per_token_cast",
    bench=BENCH.get("quant.swiglu_forward_and_per_token_cast", ()),
    oracle=ref.swiglu_forward_and_per_token_cast,
    strategy=strategies.quant.swiglu_cases,
    outputs={
        "data": Decided(
            "given sf_impl, the code of some value within the fp32 error bound of y (relative 2^-18 "
            "plus 2^-125 (1+|l|)(1+|r|)(1+|w|)) divided by sf_impl; padding rows +0"
        ),
        "sf": Decided(
            "the sf of an amax within y's error bound (plain: 1.5 ULP either side); padding rows the sf of a "
            "zero block; layout checked"
        ),
        "clamped_count": Decided("bitwise: the counter plus the exact counts, int64"),
    },
    impls=_impls(
        "swiglu_forward_and_per_token_cast",
        ReturningClampedCount("kernels.torch.quant:swiglu_forward_and_per_token_cast"),
        ReturningClampedCount("kernels.quant:swiglu_forward_and_per_token_cast"),
    ),
    given=_given_swiglu,
    doc="y = l * sigmoid(l) * r * w (clamped), per-token cast of y; clamped_count accumulates.",
))
