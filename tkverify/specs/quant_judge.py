"""How the quantisation family's outputs are judged: the spec's ``given`` hooks.

Every output's policy is decided per case (the format, storage and bound depend on
the case's parameters): a ``given`` hook checks what the implementation returned
(dtype, shape, contiguity, the TMA-aligned column-major layout, the padding bytes of
a packed ue8m0 sf), computes the expected values with the error analysis of
`tkverify.specs.quant_bounds`, and hands the output's `Decided` policy a `Judgement`:
the policy to apply, or the message of a malformed output.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

import numpy as np
import torch

import references.quant as ref
from tkverify import formats
from tkverify.policies import Bracket, Comparison, Policy, bitwise, within
from tkverify.specs.quant_bounds import (
    element_bracket,
    may_overflow_fp32,
    quotient_slack,
    sf_bracket,
    swiglu_value_error,
    unconstrained,
)

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
            return Comparison.rejected(output, expected.fmt, "layout", expected.error)
        return expected.policy.compare(output, expected.actual, expected.expected)


def malformed(message: str, fmt: str) -> Judgement:
    return Judgement(error=message, fmt=fmt)


# -- checking what an implementation returned ----------------------------------------------


def data_problem(data: Any, fmt: str, shape: tuple[int, int]) -> str | None:
    """What is wrong with returned data's dtype, shape or contiguity (None if nothing)."""
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


def sf_problem(sf: Any, rows: int, cols: int, use_ue8m0: bool, use_packed_ue8m0: bool,
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


# -- one cast, judged ---------------------------------------------------------------------


@dataclasses.dataclass
class Cast:
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
        problem = sf_problem(sf, rows, cols, self.use_ue8m0, self.use_packed_ue8m0, self.col_major)
        if problem is not None:
            return malformed(problem, sf_fmt), None
        values = ref.sf_logical_values(sf, cols)
        expected = unconstrained(sf_bracket(*self.amax_range(), self.fmt, self.round_sf),
                                 self.unconstrained_blocks(), values)
        if self.use_ue8m0:
            codes = ref.ue8m0_codes(values)  # exact: the values are decoded ue8m0 bytes
            return Judgement(within("ue8m0"), codes, expected), values
        return Judgement(within("fp32"), sf, expected), values

    def judge_data(self, data: Any, sf_values: np.ndarray | None) -> Judgement:
        """The data's judgement given sf_values (the implementation's sf; the oracle's if that is malformed)."""
        problem = data_problem(data, self.fmt, self.values.shape)
        if problem is not None:
            return malformed(problem, self.fmt)
        if sf_values is None:
            sf_values = self.oracle_sf()
        codes = ref.data_codes(data, self.fmt)
        q = ref.quotients(self.values, sf_values, self.block)
        sf_elements = ref.expand_to_elements(sf_values, self.values.shape, self.block)
        bracket = element_bracket(q, quotient_slack(q, sf_elements, self.value_error), self.fmt, codes)
        if self.unconstrained is not None:
            bracket = unconstrained(bracket, self.unconstrained, formats.get(self.fmt).decode(codes))
        if self.padding is not None and self.padding.any():
            rows = self.padding[:, None]
            bracket = Bracket(*(np.where(rows, 0.0, v) for v in (bracket.exact, bracket.low, bracket.high)))
        return Judgement(within(self.fmt), codes, bracket)


# -- the given hooks of the registered ops ---------------------------------------------------


def _sf_flags(params: dict[str, Any]) -> dict[str, Any]:
    return {
        "round_sf": params.get("round_sf", False),
        "use_ue8m0": params.get("use_ue8m0", False),
        "use_packed_ue8m0": params.get("use_packed_ue8m0", False),
        "col_major": params.get("use_tma_aligned_col_major_sf", False),
        "clamp_min": params.get("clamp_min"),
    }


def _cast_of(case, block: tuple[int, int]) -> Cast:
    return Cast(ref.as_float64(case.inputs["x"]), case.params.get("fmt", "e4m3"), block, **_sf_flags(case.params))


def given_cast(block_of: Callable[[dict[str, Any]], tuple[int, int]]):
    """The given hook of a cast whose blocks `block_of(params)` gives: its data and its sf."""
    def given(case, actual: dict[str, Any]) -> dict[str, Judgement]:
        cast = _cast_of(case, block_of(case.params))
        sf_judgement, sf_values = cast.judge_sf(actual["sf"])
        return {"sf": sf_judgement, "data": cast.judge_data(actual["data"], sf_values)}
    return given


def given_sf_only_of(block_of: Callable[[dict[str, Any]], tuple[int, int]]):
    """The given hook of a cast's sf-only variant, whose blocks `block_of(params)` gives: its sf."""
    def given(case, actual: dict[str, Any]) -> dict[str, Judgement]:
        return {"sf": _cast_of(case, block_of(case.params)).judge_sf(actual["sf"])[0]}
    return given


def given_precomputed_of(block_of: Callable[[dict[str, Any]], tuple[int, int]]):
    """The given hook of a cast with a precomputed sf, whose blocks `block_of(params)` gives: its data, judged
    given the sf the case passes."""
    def given(case, actual: dict[str, Any]) -> dict[str, Judgement]:
        params = case.params
        cast = Cast(ref.as_float64(case.inputs["x"]), params.get("fmt", "e4m3"), block_of(params))
        given_sf = ref.sf_logical_values(case.inputs["sf"], cast.grid[1])
        return {"data": cast.judge_data(actual["data"], given_sf)}
    return given


def token_block(params: dict[str, Any]) -> tuple[int, int]:
    return 1, params.get("num_per_channels", 128)


def two_d_block(params: dict[str, Any]) -> tuple[int, int]:
    return tuple(params.get("block", (128, 128)))


given_sf_only = given_sf_only_of(token_block)
given_precomputed = given_precomputed_of(token_block)


def given_cast_back(case, actual: dict[str, Any]) -> dict[str, Judgement]:
    params = case.params
    dtype = ref.out_dtype_of(params.get("out_dtype", torch.bfloat16))
    exact = ref.dequantised(case.inputs["data"], case.inputs["sf"], params.get("fmt", "e4m3"),
                            tuple(params.get("block", (1, 128))))
    out = actual["out"]
    fmt = formats.of_dtype(dtype).name
    if not isinstance(out, torch.Tensor) or out.dtype != dtype:
        return {"out": malformed(f"out must be a {dtype} tensor, got {getattr(out, 'dtype', type(out).__name__)}",
                                 fmt)}
    if not out.is_contiguous():
        return {"out": malformed(f"out must be contiguous, got strides {out.stride()}", fmt)}
    return {"out": Judgement(bitwise(dtype), out, exact)}


def given_swiglu(case, actual: dict[str, Any]) -> dict[str, Judgement]:
    params, inputs = case.params, case.inputs
    y, l, r, w, padding, counts = ref.swiglu_rows(inputs["x"], inputs.get("topk_weights"),
                                                  inputs.get("pos_to_token_topk"), params.get("clamp"))
    y = ref.fp32_range(y)
    error = np.where(padding[:, None], 0.0, swiglu_value_error(y, l, r, w))
    overflow = may_overflow_fp32(l, r, w) & ~padding[:, None]
    cast = Cast(y, params.get("fmt", "e4m3"), (1, params.get("num_per_channels", 128)), **_sf_flags(params),
                value_error=error, padding=padding, unconstrained=overflow)
    sf_judgement, sf_values = cast.judge_sf(actual["sf"])
    data_judgement = cast.judge_data(actual["data"], sf_values)
    expected_count = ref.updated_count(inputs.get("clamped_count"), counts)
    count = actual["clamped_count"]
    if not isinstance(count, torch.Tensor) or count.dtype != torch.int64:
        count_judgement = malformed(f"clamped_count must stay an int64 tensor, got {count!r}", "int64")
    else:
        count_judgement = Judgement(bitwise(torch.int64), count, expected_count.numpy())
    return {"data": data_judgement, "sf": sf_judgement, "clamped_count": count_judgement}
