"""The quantisation layout ops (docs/contract/quant_layout.md): quant.per_channel_cast_and_transpose, a
composition judged through quant.per_channel_cast's judge on the data transposed back;
quant.per_channel_cast_fused, a composition (cast_back in fp32, a row gather, the per-channel cast) judged
through the same judge on the exact values the cast receives; and
quant.per_block_cast_lossless, an exact re-coding of e2m1 codes as e4m3 codes, judged bitwise; and
quant.batched_transpose_weight_sf, a weight's power-of-two scales re-laid as deep_gemm's MN-major packed
ue8m0 words, judged bitwise after the check of each output's shape and strides.

Input classes (the differential suite tags each judged case ``class: <name>`` per class it is in,
computed from its tensors by `strategies.classes.case_classes`; ``<class>:<input>`` names the input; the
report counts them and tests/test_classes.py fails where one has no example under the ci profile).
``lossless:<edge>`` are the lossless cast's edges (strategies/quant_layout.py says what each is):

* quant.per_channel_cast_and_transpose: ``dtype_max:x``, ``empty``, ``nan:x``, ``nan_payload:x``,
  ``neg_inf:x``, ``neg_zero:x``, ``non_pow2``, ``pos_inf:x``, ``signed_zero_tie:x``, ``single_row``,
  ``subnormal:x``.
* quant.per_channel_cast_fused: ``empty``, ``nan:x``, ``nan:x_sf``, ``non_pow2``, ``single_row``,
  ``padding_row:pos_to_token``.
* quant.per_block_cast_lossless: ``empty``, ``non_pow2``, ``single_row``, ``lossless:sf_span``,
  ``lossless:max_code``, ``lossless:min_code``, ``lossless:zero_block``, ``lossless:nan_sf``,
  ``lossless:sf_top``, ``lossless:sf_bottom``.
* quant.batched_transpose_weight_sf: ``non_pow2``, ``single_row``, ``subnormal:sf``, ``weight_sf:grouped``,
  ``weight_sf:partial_sf0_word``, ``weight_sf:partial_sf1_word``, ``weight_sf:sf_top``,
  ``weight_sf:sf_bottom`` (strategies/quant_layout.py says what each is).
"""

from __future__ import annotations

from typing import Any

import torch

import references.quant as qref
import references.quant_layout as ref
import strategies.quant_layout
from tkverify import benchshapes
from tkverify.case import Case
from tkverify.policies import bitwise
from tkverify.registry import BenchShape, OpSpec, register, tilelang_impl, torch_impl
from tkverify.specs.quant_judge import (Cast, Decided, Judgement, _sf_flags, data_problem, given_cast, malformed,
                                        sf_problem)

TOKENS, HIDDEN = 16384, 7168  # the mHC / Engram bench's tokens and hidden size


# -- quant.per_channel_cast_and_transpose --------------------------------------------------------------

_per_channel_given = given_cast(lambda p: (p.get("num_per_tokens", 128), 1))


def given_channel_transpose(case: Case, actual: dict[str, Any]) -> dict[str, Judgement]:
    """quant.per_channel_cast's judgement of (data transposed back, sf), after checking that data is the
    contiguous (H, T) transpose."""
    data = actual["data"]
    num_rows, hidden = case.inputs["x"].shape
    if isinstance(data, torch.Tensor):
        if tuple(data.shape) != (hidden, num_rows) or not data.is_contiguous():
            judged = _per_channel_given(case, {"data": None, "sf": actual["sf"]})
            return {"sf": judged["sf"], "data": malformed(
                f"transposed data must be contiguous with shape (H, T) = {(hidden, num_rows)}, got shape "
                f"{tuple(data.shape)}, strides {data.stride()}", "e4m3")}
        data = data.t().contiguous()
    return _per_channel_given(case, {"data": data, "sf": actual["sf"]})


def _channel_transpose_shape(device: Any) -> tuple[dict, dict]:
    return {"x": benchshapes.randn((TOKENS, HIDDEN), torch.bfloat16, device)}, {"fmt": "e4m3", "num_per_tokens": 128}


def _channel_transpose_bytes(inputs: dict, params: dict) -> int:
    tokens, hidden = inputs["x"].shape
    return 2 * tokens * hidden + tokens * hidden + (tokens // params["num_per_tokens"]) * hidden * 4


register(OpSpec(
    name="quant.per_channel_cast_and_transpose",
    oracle=ref.per_channel_cast_and_transpose,
    strategy=strategies.quant_layout.per_channel_cast_and_transpose_cases,
    outputs={
        "data": Decided("quant.per_channel_cast's data judgement, on data (H, T) transposed back; layout checked"),
        "sf": Decided("quant.per_channel_cast's sf judgement"),
    },
    impls={"torch": torch_impl("kernels.torch.quant_layout:per_channel_cast_and_transpose"),
           "tilelang": tilelang_impl("kernels.quant.channel_transpose:per_channel_cast_and_transpose")},
    given=given_channel_transpose,
    doc="quant.per_channel_cast (e4m3) of x (T, H), data transposed to (H, T).",
    bench=(BenchShape(f"{TOKENS}x{HIDDEN} bf16 e4m3/128", _channel_transpose_shape, _channel_transpose_bytes,
                      target=0.9),),
))


# -- quant.per_channel_cast_fused ------------------------------------------------------------------------


def given_channel_fused(case: Case, actual: dict[str, Any]) -> dict[str, Judgement]:
    """quant.per_channel_cast's judge (`Cast`) of the exact values the cast receives (x, or x's codes times x_sf
    rounded once to fp32, gathered by pos_to_token): those values are exact, so no value error."""
    p, inputs = case.params, case.inputs
    values = ref.fused_cast_values(inputs["x"], inputs.get("x_sf"), p.get("num_per_channels"),
                                   inputs.get("pos_to_token"))
    cast = Cast(values, "e4m3", (p.get("num_per_tokens", 128), 1), **_sf_flags(p))
    sf_judgement, sf_values = cast.judge_sf(actual["sf"])
    return {"sf": sf_judgement, "data": cast.judge_data(actual["data"], sf_values)}


def _channel_fused_shape(device: Any) -> tuple[dict, dict]:
    x = benchshapes.randn((TOKENS, HIDDEN), torch.bfloat16, device).to(torch.float8_e4m3fn)
    x_sf = torch.ones(TOKENS, HIDDEN // 128, dtype=torch.float32, device=device)
    return {"x": x, "x_sf": x_sf}, {"fmt": "e4m3", "num_per_tokens": 128, "num_per_channels": 128}


def _channel_fused_bytes(inputs: dict, params: dict) -> int:
    tokens, hidden = inputs["x"].shape
    return 2 * tokens * hidden + inputs["x_sf"].numel() * 4 + (tokens // params["num_per_tokens"]) * hidden * 4


register(OpSpec(
    name="quant.per_channel_cast_fused",
    oracle=ref.per_channel_cast_fused,
    strategy=strategies.quant_layout.per_channel_cast_fused_cases,
    outputs={
        "data": Decided("quant.per_channel_cast's data judgement of the gathered (dequantised) values"),
        "sf": Decided("quant.per_channel_cast's sf judgement of the gathered (dequantised) values"),
    },
    impls={"torch": torch_impl("kernels.torch.quant_layout:per_channel_cast_fused"),
           "tilelang": tilelang_impl("kernels.quant.channel_transpose:per_channel_cast_fused")},
    given=given_channel_fused,
    doc="quant.per_channel_cast (e4m3) of x, or of cast_back(x, x_sf) in fp32, rows gathered by pos_to_token.",
    bench=(BenchShape(f"{TOKENS}x{HIDDEN} e4m3 (1, 128) -> e4m3/128", _channel_fused_shape, _channel_fused_bytes,
                      target=0.9),),
))


# -- quant.per_block_cast_lossless --------------------------------------------------------------------


def given_lossless(case: Case, actual: dict[str, Any]) -> dict[str, Judgement]:
    """data bitwise against the oracle's e4m3 codes, sf bitwise in its storage, after the layout checks."""
    p = case.params
    expected_data, expected_sf = ref.per_block_cast_lossless(**case.inputs, **p)
    flags = _sf_flags(p)
    rows, cols = expected_sf.shape[0], qref.sf_grid(*expected_data.shape, tuple(p["out_block_size"]))[1]
    sf_fmt = "ue8m0" if flags["use_ue8m0"] else "fp32"
    problem = sf_problem(actual["sf"], rows, cols, flags["use_ue8m0"], flags["use_packed_ue8m0"], flags["col_major"])
    sf = (malformed(problem, sf_fmt) if problem else
          Judgement(bitwise(expected_sf.dtype), actual["sf"].contiguous(), expected_sf.contiguous(), fmt=sf_fmt))
    problem = data_problem(actual["data"], "e4m3", tuple(expected_data.shape))
    data = malformed(problem, "e4m3") if problem else Judgement(bitwise(torch.float8_e4m3fn), actual["data"],
                                                                expected_data, fmt="e4m3")
    return {"data": data, "sf": sf}


def _lossless_shape(device: Any) -> tuple[dict, dict]:
    x = torch.randint(-128, 128, (TOKENS, HIDDEN // 2), dtype=torch.int8, device=device)
    exponents = torch.randint(-8, 0, (TOKENS, HIDDEN // 32), device=device)
    return ({"x": x, "x_sf": torch.pow(2.0, exponents.float())},
            {"fmt": "e4m3", "x_block_size": (1, 32), "out_block_size": (128, 128)})


def _lossless_bytes(inputs: dict, params: dict) -> int:
    x, x_sf = inputs["x"], inputs["x_sf"]
    return x.numel() + x_sf.numel() * x_sf.element_size() + 2 * x.numel()  # codes and sf read, e4m3 written


register(OpSpec(
    name="quant.per_block_cast_lossless",
    oracle=ref.per_block_cast_lossless,
    strategy=strategies.quant_layout.per_block_cast_lossless_cases,
    outputs={
        "data": Decided("bitwise: the e4m3 code of codes(x) * x_sf / out sf (exact); NaN blocks NaN"),
        "sf": Decided("bitwise: 2^-6 times the largest input sf of the out block, in the storage asked for; "
                      "layout checked"),
    },
    impls={"torch": torch_impl("kernels.torch.quant_layout:per_block_cast_lossless"),
           "tilelang": tilelang_impl("kernels.quant.lossless:per_block_cast_lossless")},
    given=given_lossless,
    doc="e2m1 codes with power-of-two sf re-coded exactly as e4m3 codes in larger blocks: (data, sf).",
    bench=(BenchShape(f"{TOKENS}x{HIDDEN} e2m1 (1, 32) -> e4m3 (128, 128)", _lossless_shape, _lossless_bytes,
                      target=0.9),),
))


# -- quant.batched_transpose_weight_sf ----------------------------------------------------------------


def strided_problem(t: Any, expected: torch.Tensor) -> str | None:
    """What is wrong with a returned packed sf's dtype, shape or strides against the oracle's (None if
    nothing).  The stride of a dimension of one element addresses nothing, so it is not compared."""
    if not isinstance(t, torch.Tensor):
        return f"expected a tensor, got {type(t).__name__}"
    if t.dtype != torch.int32:
        return f"packed ue8m0 words must be torch.int32, got {t.dtype}"
    if tuple(t.shape) != tuple(expected.shape):
        return f"shape must be {tuple(expected.shape)}, got {tuple(t.shape)}"
    wanted = [s if n > 1 else None for n, s in zip(expected.shape, expected.stride())]
    got = [s if n > 1 else None for n, s in zip(t.shape, t.stride())]
    if wanted != got:
        return (f"strides must be {expected.stride()} (MN-major; any stride on a dimension of one element), "
                f"got {t.stride()}")
    return None


def given_weight_sf(case: Case, actual: dict[str, Any]) -> dict[str, Judgement]:
    """sf0 and sf1 bitwise against the oracle's words (padding bytes included), after their layout checks."""
    expected = dict(zip(("sf0", "sf1"), ref.batched_transpose_weight_sf(**case.inputs, **case.params)))
    judged = {}
    for name, want in expected.items():
        problem = strided_problem(actual[name], want)
        judged[name] = (malformed(problem, "ue8m0") if problem else
                        Judgement(bitwise(torch.int32), actual[name].contiguous(), want.contiguous(), fmt="ue8m0"))
    return judged


def _weight_sf_shape(groups: int | None, n: int, k: int, block_size: int):
    def make(device: Any) -> tuple[dict, dict]:
        shape = ((groups,) if groups else ()) + (n // block_size, k // block_size)
        exponents = torch.randint(-20, 1, shape, generator=benchshapes.generator(torch.device("cpu"), 0))
        sf = torch.pow(2.0, exponents.double()).float().to(device)
        return {"sf": sf}, {"block_size": block_size, "transpose_sf1": False}
    return make


def _weight_sf_written(inputs: dict, params: dict) -> int:
    """Bytes of sf0 and sf1: G * (words0 * n + words1 * k) int32 words."""
    sf, bs = inputs["sf"], params["block_size"]
    groups = sf.shape[0] if sf.dim() == 3 else 1
    num_sf_n, num_sf_k = sf.shape[-2:]
    return 4 * groups * (-(-num_sf_k // 4) * num_sf_n * bs + -(-num_sf_n // 4) * num_sf_k * bs)


def _weight_sf_bytes(inputs: dict, params: dict) -> int:
    """sf read once, both outputs written (about bs / 2 times the bytes read: each sf lands in bs / 4 words of
    each output)."""
    return inputs["sf"].numel() * 4 + _weight_sf_written(inputs, params)


register(OpSpec(
    name="quant.batched_transpose_weight_sf",
    oracle=ref.batched_transpose_weight_sf,
    strategy=strategies.quant_layout.batched_transpose_weight_sf_cases,
    outputs={
        "sf0": Decided("bitwise: int32 (G?, n, ceil(num_sf_k / 4)) MN-major, word [r, w] packing the ue8m0 bytes "
                       "of sf[r // bs, 4w..4w+3], padding bytes zero; shape and strides checked"),
        "sf1": Decided("bitwise: int32 (G?, k, ceil(num_sf_n / 4)) MN-major (or its transpose with "
                       "transpose_sf1), word [c, w] packing sf[4w..4w+3, c // bs]; shape and strides checked"),
    },
    impls={"torch": torch_impl("kernels.torch.quant_layout:batched_transpose_weight_sf"),
           "tilelang": tilelang_impl("kernels.quant.sf_layout:batched_transpose_weight_sf")},
    given=given_weight_sf,
    doc="One weight's fp32 power-of-two scales as deep_gemm's MN-major packed ue8m0 sf0 / sf1: (sf0, sf1).",
    # A few hundred kB move per call: launch latency dominates, so these are judged by time (target None).
    bench=(BenchShape("n7168 k2048 bs128", _weight_sf_shape(None, 7168, 2048, 128), _weight_sf_bytes, target=None,
                      written=_weight_sf_written),
           BenchShape("G8 n4096 k7168 bs128", _weight_sf_shape(8, 4096, 7168, 128), _weight_sf_bytes,
                      target=None, written=_weight_sf_written)),
))
