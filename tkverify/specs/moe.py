"""MoE routing ops: topk_gate and the routing chain group_count -> fused_mapping ->
expand_to_fused -> (experts) -> reduce_fused, with normalize_weight for the weights.

What each op computes, its edge semantics and the bounds its sums are judged by are
docs/contract/moe.md; signatures and argument checks are kernels/torch/moe.py's.  Indices,
counts and moved bits are judged bitwise: `HostInt` for fused_mapping's N (a python int),
`StoredBitwise` for expand_to_fused's outputs, which also checks the sf layout
(`WithSfLayout` lays a case's x_sf out before the call).  reduce_fused and normalize_weight
are judged by `summation`, from the exact terms (`reduce_fused_bound`,
`normalize_denom_bound`), normalize_weight's weights given the implementation's own denom.

Input classes (the differential suite tags each judged case ``class: <name>`` per class it is in,
computed from its tensors by `strategies.classes.case_classes`; ``<class>:<input>`` names the input; the
report counts them and tests/test_classes.py fails where one has no example under the ci profile):

* moe.expand_to_fused: ``dtype_max:x``, ``empty``, ``nan:x``, ``nan_payload:x``, ``neg_inf:x``,
  ``neg_zero:x``, ``non_pow2``, ``signed_zero_tie:x``, ``subnormal:x``.
* moe.expand_to_fused_with_sf: ``dtype_max:x``, ``empty``, ``nan:x``, ``nan:x_sf``, ``nan_payload:x_sf``,
  ``neg_zero:x``, ``non_pow2``, ``signed_zero_tie:x``, ``single_row``, ``subnormal:x``, ``subnormal:x_sf``.
* moe.fused_mapping: ``empty``, ``non_pow2``, ``single_row``.
* moe.group_count: ``empty``, ``non_pow2``.
* moe.normalize_weight: ``empty``, ``neg_zero:topk_weights``, ``non_pow2``, ``signed_zero_tie:topk_weights``,
  ``single_row``, ``subnormal:topk_weights``, ``zero_row:topk_weights``.
* moe.reduce_fused: ``dtype_max:x``, ``empty``, ``nan:topk_weights``, ``nan:x``, ``nan:x_sf``,
  ``nan_payload:x``, ``neg_inf:x``, ``neg_zero:topk_weights``, ``neg_zero:x``, ``non_pow2``, ``pos_inf:x``,
  ``signed_zero_tie:x``, ``subnormal:topk_weights``, ``subnormal:x``, ``zero_row:topk_weights``,
  ``zero_row:x``.
* moe.topk_gate: ``dtype_max:scores``, ``empty``, ``nan:scores``, ``nan_payload:scores``, ``neg_inf:scores``,
  ``neg_zero:scores``, ``non_pow2``, ``pos_inf:scores``, ``signed_zero_tie:scores``, ``subnormal:scores``,
  ``zero_row:scores``.
"""

from __future__ import annotations

import dataclasses
import importlib
from typing import Any, Callable

import numpy as np
import torch

import references.moe
import references.quant
import strategies.moe
from strategies.layouts import LAYOUTS
from tkverify.policies import (
    FP32_UNDERFLOW,
    FP32_UNIT_ROUNDOFF,
    Comparison,
    ErrorBound,
    Policy,
    bitwise,
    signed_reach,
    summation,
    summation_error,
)
from tkverify import benchshapes
from tkverify.registry import BenchShape, OpSpec, register, tilelang_impl, torch_impl

# -- benchmark shapes (tkverify bench) ------------------------------------------------------
# DeepSeek-V3's routing: T = 16384 tokens, K = 8 of E = 256 experts, hidden 7168 in bf16,
# segments aligned to 128 rows.
_T, _E, _K, _H, _ALIGN = 16384, 256, 8, 7168, 128


_ROW_PADDING = 128  # elements past each row of the strided scores' wider buffer


def _topk_shape(device):
    return {"scores": benchshapes.randn((_T, _E), torch.float32, device)}, {"k": _K}


def _topk_strided_shape(device):
    """scores = buf[:, :E] of a (T, E + 128) buffer: read in place at row stride E + 128."""
    return {"scores": benchshapes.randn((_T, _E + _ROW_PADDING), torch.float32, device)[:, :_E]}, {"k": _K}


def _topk_bytes(i, p):
    # the scores read (the rows' padding never is) and the indices written
    return benchshapes.nbytes(i["scores"]) + i["scores"].shape[0] * p["k"] * 8


def _routed_idx(device):
    return {"idx": benchshapes.routing(_T, _E, _K, _ALIGN, device)["topk_idx"]}, {"num_groups": _E}


def _mapping_shape(device):
    return ({"topk_idx": benchshapes.routing(_T, _E, _K, _ALIGN, device)["topk_idx"]},
            {"num_experts": _E, "alignment": _ALIGN})


def _mapping_bytes(i, p):
    pairs = i["topk_idx"].numel()
    counts = torch.bincount(i["topk_idx"].reshape(-1), minlength=p["num_experts"])
    num_rows = int(((counts + p["alignment"] - 1) // p["alignment"] * p["alignment"]).sum())
    return pairs * 8 + pairs * 4 + 2 * num_rows * 4 + 2 * p["num_experts"] * 4


def _expand_shape(device, tokens=_T):
    r = benchshapes.routing(tokens, _E, _K, _ALIGN, device)
    return ({"x": benchshapes.randn((tokens, _H), torch.bfloat16, device, 1),
             "token_topk_to_pos": r["token_topk_to_pos"]}, {"num_expanded_rows": r["num_rows"]})


def _expand_written(i, p):
    # every row of out written once (padding rows are zeroed)
    return p["num_expanded_rows"] * i["x"].shape[1] * i["x"].element_size()


def _expand_bytes(i, p):
    # x and the positions read once, out written
    return benchshapes.nbytes(i["x"]) + benchshapes.nbytes(i["token_topk_to_pos"]) + _expand_written(i, p)


def _reduce_shape(device, tokens=_T):
    r = benchshapes.routing(tokens, _E, _K, _ALIGN, device)
    return ({"x": benchshapes.randn((r["num_rows"], _H), torch.bfloat16, device, 1),
             "topk_weights": torch.rand(tokens, _K, device=device, generator=benchshapes.generator(device, 2)),
             "token_topk_to_pos": r["token_topk_to_pos"]}, {})


def _fewer_tokens(make):
    """The pilot of a routed shape: the whole routing rebuilt for a fraction of the tokens, so that every
    position stays inside the expanded rows (cutting the inputs' leading dimension would not)."""
    return lambda device, fraction: make(device, max(1, int(_T * fraction)))


def _reduce_bytes(i, p):
    # the rows slots reach (T * K, padding rows are never read), out written, weights and positions read
    pairs = i["token_topk_to_pos"].numel()
    row = i["x"].shape[1] * i["x"].element_size()
    return pairs * row + i["token_topk_to_pos"].shape[0] * row + pairs * 8


def _normalize_shape(device):
    return {"topk_weights": torch.rand(_T, _K, device=device, generator=benchshapes.generator(device, 2))}, {}


_SHAPE = f"T{_T} E{_E} K{_K}"
_DATA_SHAPE = f"T{_T} K{_K} H{_H} bf16"
# Latency-bound ops (a few MB or less): judged by time alone (target None), and against tile-kernels.
BENCH = {
    "moe.topk_gate": (BenchShape(f"{_SHAPE} f32", _topk_shape, _topk_bytes, target=None),
                      BenchShape(f"{_SHAPE} f32 row stride E+{_ROW_PADDING}", _topk_strided_shape, _topk_bytes,
                                 target=None)),
    "moe.group_count": (BenchShape(f"{_SHAPE} int64", _routed_idx,
                                   lambda i, p: benchshapes.nbytes(i["idx"]) + p["num_groups"] * 4, target=None),),
    "moe.fused_mapping": (BenchShape(f"{_SHAPE} align {_ALIGN}", _mapping_shape, _mapping_bytes, target=None),),
    "moe.expand_to_fused": (BenchShape(_DATA_SHAPE, _expand_shape, _expand_bytes, written=_expand_written,
                                       pilot=_fewer_tokens(_expand_shape)),),
    "moe.reduce_fused": (BenchShape(_DATA_SHAPE, _reduce_shape, _reduce_bytes, pilot=_fewer_tokens(_reduce_shape)),),
    "moe.normalize_weight": (BenchShape(f"T{_T} K{_K}", _normalize_shape,
                                        lambda i, p: 2 * benchshapes.nbytes(i["topk_weights"]) + _T * 4,
                                        target=None),),
}


register(OpSpec(
    name="moe.topk_gate",
    bench=BENCH.get("moe.topk_gate", ()),
    oracle=references.moe.topk_gate,
    strategy=strategies.moe.topk_gate_cases,
    outputs={"indices": bitwise(torch.int64)},
    impls={
        # Both take scores at any row stride (the TileLang kernel reads it in place at the row stride).
        "torch": torch_impl("kernels.torch.moe:topk_gate", layouts={"scores": LAYOUTS}),
        "tilelang": dataclasses.replace(tilelang_impl("kernels.moe:topk_gate"), layouts={"scores": LAYOUTS}),
    },
    doc="Indices of the k largest scores per row: torch.sort(descending, stable) order, NaN first.",
))


# -- judging the routing chain's outputs ----------------------------------------------------


@dataclasses.dataclass(frozen=True)
class HostInt(Policy):
    """A python int (not a tensor, not a bool) equal to the expected one."""

    def compare(self, output: str, actual: Any, expected: Any) -> Comparison:
        if isinstance(actual, bool) or not isinstance(actual, int):
            return Comparison.rejected(output, "int", "host_int",
                                       f"expected a python int, got {type(actual).__name__}")
        return bitwise().compare(output, np.array(actual, dtype=np.int64), np.array(expected, dtype=np.int64))


@dataclasses.dataclass(frozen=True)
class Stored:
    """Expected bits (a CPU tensor of the dtype the output must have) and the layout they must be stored in."""

    values: torch.Tensor
    column_major: bool = False  # TMA-aligned column-major; else row-major contiguous


def _layout_problem(actual: Any, expected: Stored) -> str | None:
    if not isinstance(actual, torch.Tensor):
        return f"expected a tensor, got {type(actual).__name__}"
    if actual.dtype != expected.values.dtype:
        return f"dtype {actual.dtype}, expected {expected.values.dtype}"
    if tuple(actual.shape) != tuple(expected.values.shape):
        return f"shape {tuple(actual.shape)}, expected {tuple(expected.values.shape)}"
    rows, cols = actual.shape
    if actual.numel() == 0:
        return None
    if expected.column_major:
        padded = references.quant.tma_padded_rows(rows, actual.dtype)
        if (rows > 1 and actual.stride(0) != 1) or (cols > 1 and actual.stride(1) != padded):
            return (f"a TMA-aligned column-major output needs strides (1, {padded}), got {actual.stride()} "
                    f"for shape {tuple(actual.shape)}")
    elif not actual.is_contiguous():
        return f"a row-major output must be contiguous, got strides {actual.stride()} for shape {tuple(actual.shape)}"
    return None


@dataclasses.dataclass(frozen=True)
class StoredBitwise(Policy):
    """Bitwise against `Stored` values (NaN payloads and -0 count), after checking dtype, shape and layout."""

    def compare(self, output: str, actual: Any, expected: Any) -> Comparison:
        if not isinstance(expected, Stored):
            raise TypeError(f"output {output!r}: StoredBitwise needs a Stored expectation, got {type(expected).__name__}")
        problem = _layout_problem(actual, expected)
        if problem is not None:
            return Comparison.rejected(output, str(expected.values.dtype).removeprefix("torch."), "layout", problem)
        if expected.values.is_floating_point():
            return bitwise(expected.values.dtype).compare(output, actual, expected.values)
        return bitwise(expected.values.dtype).compare(output, actual, expected.values.numpy())


def _given_expand(case, actual: dict[str, Any]) -> dict[str, Stored]:
    params = dict(case.params)
    layout = params.pop("sf_layout", None)
    moved = references.moe.expand_to_fused(**case.inputs, **params)
    if "x_sf" not in case.inputs:
        return {"out": Stored(moved)}
    out, out_sf = moved
    return {"out": Stored(out), "sf": Stored(out_sf, layout == "tma_column_major")}


class WithSfLayout:
    """Calls an expand_to_fused implementation (by import path, resolved on first use)
    with x_sf stored in the case's ``sf_layout``.

    A case's tensors lose their strides on the way to the device and into a
    case file, so the with-sf cases carry the layout as a parameter and this
    wrapper lays x_sf out (on its device) just before the call.
    """

    def __init__(self, target: str | Callable[..., Any]):
        self.target = target
        self._fn = target if callable(target) else None

    def __repr__(self) -> str:
        return f"WithSfLayout({self.target!r})"

    def __call__(self, *, x_sf: torch.Tensor, sf_layout: str, **kwargs: Any):
        if self._fn is None:
            module, _, attr = self.target.partition(":")
            self._fn = getattr(importlib.import_module(module), attr)
        if sf_layout == "tma_column_major":
            x_sf = references.moe.store_tma_column_major(x_sf)
        elif sf_layout != "row_major":
            raise ValueError(f"sf_layout must be 'row_major' or 'tma_column_major', got {sf_layout!r}")
        return self._fn(x_sf=x_sf, **kwargs)


def _expand_oracle_with_sf(x, token_topk_to_pos, num_expanded_rows, x_sf, sf_layout):
    return references.moe.expand_to_fused(x, token_topk_to_pos, num_expanded_rows, x_sf)


def reduce_fused_bound(x: torch.Tensor, topk_weights: torch.Tensor, token_topk_to_pos: torch.Tensor,
                       x_sf: torch.Tensor | None = None) -> ErrorBound:
    """The exact reduce_fused and the error an fp32 accumulation may add (docs/contract/moe.md#moe.reduce_fused)."""
    exact = references.moe.reduce_fused(x, topk_weights, token_topk_to_pos, x_sf)
    t = references.moe.reduce_fused_terms(x, topk_weights, token_topk_to_pos, x_sf)
    products = 1 if x_sf is None else 2
    per_product = FP32_UNDERFLOW if products == 1 else FP32_UNDERFLOW * (1 + 2 * t.largest_factor)
    error = summation_error(t.magnitude, t.count, roundings_per_term=products, absolute=t.count * per_product)
    reach = signed_reach(t.terms, t.count, roundings_per_term=products, partial=t.partial)
    return ErrorBound(exact, error, "fp32" if x.dtype == torch.float32 else "bf16", reach)


def _given_reduce(case, actual: dict[str, Any]) -> dict[str, ErrorBound]:
    return {"out": reduce_fused_bound(**case.inputs)}


def normalize_denom_bound(topk_weights: torch.Tensor) -> ErrorBound:
    """The exact denom and the error an fp32 sum of the K weights and 1e-20 may have
    (docs/contract/moe.md#moe.normalize_weight)."""
    denom, _ = references.moe.normalize_weight(topk_weights)
    w = references.as_float64(topk_weights)
    eps = references.moe.NORMALIZE_EPS
    error = summation_error(np.abs(w).sum(axis=1) + eps, w.shape[1] + 1, roundings_per_term=0,
                            absolute=FP32_UNIT_ROUNDOFF * eps)
    return ErrorBound(denom, error, "fp32")


def normalized_weights_given_denom(topk_weights: torch.Tensor, denom: np.ndarray) -> ErrorBound:
    """w / denom for the given denom, within two fp32 roundings (docs/contract/moe.md#moe.normalize_weight)."""
    w = references.as_float64(topk_weights)
    with np.errstate(invalid="ignore", divide="ignore"):
        quotient = w / np.asarray(denom, dtype=np.float64)[:, None]
    error = summation_error(np.abs(quotient), 1, roundings_per_term=2, absolute=FP32_UNDERFLOW)
    return ErrorBound(quotient, error, "fp32")


def _given_normalize(case, actual: dict[str, Any]) -> dict[str, ErrorBound]:
    w = case.inputs["topk_weights"]
    denom_bound = normalize_denom_bound(w)
    denom = actual["denom"]
    if isinstance(denom, torch.Tensor) and denom.dtype == torch.float32 and tuple(denom.shape) == (w.shape[0],):
        used = denom.detach().cpu().double().numpy()
    else:  # malformed (and failing on its own): judge the weights against the fp32 exact denom
        used = np.asarray(denom_bound.exact, dtype=np.float32).astype(np.float64)
    return {"denom": denom_bound, "weights": normalized_weights_given_denom(w, used)}


def _impls(name: str) -> dict:
    return {"torch": torch_impl(f"kernels.torch.moe:{name}"), "tilelang": tilelang_impl(f"kernels.moe:{name}")}


_INT32 = bitwise(torch.int32)

register(OpSpec(
    name="moe.group_count",
    bench=BENCH.get("moe.group_count", ()),
    oracle=references.moe.group_count,
    strategy=strategies.moe.group_count_cases,
    outputs={"counts": _INT32},
    impls=_impls("group_count"),
    doc="counts[g] = #entries of idx equal to g; negative and >= num_groups entries count nowhere.",
))

register(OpSpec(
    name="moe.fused_mapping",
    bench=BENCH.get("moe.fused_mapping", ()),
    oracle=references.moe.fused_mapping,
    strategy=strategies.moe.fused_mapping_cases,
    outputs={
        "pos_to_token": _INT32,
        "pos_to_token_topk": _INT32,
        "token_topk_to_pos": _INT32,
        "expert_start": _INT32,
        "expert_end": _INT32,
        "N": HostInt(),
    },
    impls=_impls("fused_mapping"),
    doc="Counting sort of (token, slot) pairs by expert, segments aligned and padded with -1; N a python int.",
))

register(OpSpec(
    name="moe.expand_to_fused",
    bench=BENCH.get("moe.expand_to_fused", ()),
    oracle=references.moe.expand_to_fused,
    strategy=strategies.moe.expand_to_fused_cases,
    outputs={"out": StoredBitwise()},
    impls=_impls("expand_to_fused"),
    given=_given_expand,
    doc="out[pos(t, k)] = x[t], padding rows zero; bits moved unchanged.",
))

register(OpSpec(
    name="moe.expand_to_fused_with_sf",
    bench=BENCH.get("moe.expand_to_fused_with_sf", ()),
    oracle=_expand_oracle_with_sf,
    strategy=strategies.moe.expand_to_fused_with_sf_cases,
    outputs={"out": StoredBitwise(), "sf": StoredBitwise()},
    impls={
        "torch": torch_impl(WithSfLayout("kernels.torch.moe:expand_to_fused")),
        "tilelang": tilelang_impl(WithSfLayout("kernels.moe:expand_to_fused")),
    },
    given=_given_expand,
    doc="expand_to_fused of a quantised x with its per-token sf (fp32, ue8m0, packed; row- or TMA column-major).",
))

register(OpSpec(
    name="moe.reduce_fused",
    bench=BENCH.get("moe.reduce_fused", ()),
    oracle=references.moe.reduce_fused,
    strategy=strategies.moe.reduce_fused_cases,
    outputs={"out": summation()},
    impls=_impls("reduce_fused"),
    given=_given_reduce,
    doc="out[t] = sum_k w[t, k] x[pos(t, k)], fp32 accumulation, |y - S| <= gamma_{K-1+r} sum|w x| + 0.5 ulp_out.",
))

register(OpSpec(
    name="moe.normalize_weight",
    bench=BENCH.get("moe.normalize_weight", ()),
    oracle=references.moe.normalize_weight,
    strategy=strategies.moe.normalize_weight_cases,
    outputs={"denom": summation("fp32"), "weights": summation("fp32")},
    impls=_impls("normalize_weight"),
    given=_given_normalize,
    doc="denom = 1e-20 + sum_k w (within gamma_K (sum|w| + 1e-20)); weights = w / denom (given denom, gamma_2).",
))
