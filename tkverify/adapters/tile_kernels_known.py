"""tile-kernels' known discrepancies: the findings of ``reports/tile-kernels/findings.md`` as predicates.

A finding here is one that a committed case reproduced on the H200 for the
releases it names.  Each says where it occurs (a predicate over the case: the
finding's input domain) and how it shows (the outputs that disagree, or the
text of the error raised).  `known` is the adapter's `Impl.known` hook: a
failure of tile-kernels that matches a finding on all counts is reported as
that finding (`KnownDiscrepancy`) instead of failing the test, so that
``--tk-impl all`` stays a useful signal: every other failure of tile-kernels,
on the same ops included, still fails.  Nothing here touches a bound or a
report row; the rows keep their failing elements.

Left out on purpose: refusals (F5, F6,
which the adapter raises as `Unsupported`), adapter mistakes (F7, F11,
fixed), and G13 (1.0.0's e5m6 codes off by one): a predicate can name the
outputs that fail, not by how much, so declaring it would also excuse any
larger e5m6 error.
"""

from __future__ import annotations

import dataclasses
import math
import re
from typing import Callable

import numpy as np
import torch

from references import quant as quant_ref
from tkverify.case import Case
from tkverify.registry import Failure

BOTH = ("1.0.0", "2.1.0")
FINDINGS_FILE = "reports/tile-kernels/findings.md"  # named in the message for a reader; never opened
_TOKEN_CASTS = ("quant.per_token_cast", "quant.per_token_cast_with_sf_only")
_SWIGLU = "quant.swiglu_forward_and_per_token_cast"
# An empty batch's crash, as each release words it (2.1.0 / tilelang 0.1.15; 1.0.0 / 0.1.11).  (1.0.0's
# pre_split_mixes "Divide by zero" on an empty batch is F12's post_mult = 0, not the empty batch.)
_EMPTY_GRID = r"grid dimension must be positive|grid_dim\(0\) > 0"


@dataclasses.dataclass(frozen=True)
class Finding:
    id: str
    title: str
    releases: tuple[str, ...]
    ops: tuple[str, ...]
    domain: Callable[[str, Case], bool]  # (op, case): the case lies where the finding occurs
    outputs: frozenset[str] | None = None  # the outputs it makes disagree (any subset of them)
    error: str | None = None  # a regex over the error it raises (None: it raises nothing)
    backward: bool | None = None  # only the forward (False), only the backward (True), either (None)

    def explains(self, release: str | None, case: Case, failure: Failure) -> bool:
        if release not in self.releases or failure.op not in self.ops:
            return False
        if self.backward is not None and failure.backward != self.backward:
            return False
        if failure.outputs is None:
            if self.error is None or not re.search(self.error, failure.message):
                return False
        elif self.outputs is None or not failure.outputs <= self.outputs:
            return False
        return self.domain(failure.op, case)


def _amax_input(op: str, case: Case) -> np.ndarray:
    """What the cast's block amax runs over: x, or SwiGLU's y (infinite where it leaves the fp32 range)."""
    x = case.inputs["x"]
    if op != _SWIGLU:
        return x.double().numpy()
    y = quant_ref.swiglu_rows(x, case.inputs.get("topk_weights"), case.inputs.get("pos_to_token_topk"),
                              case.params.get("clamp"))[0]
    return quant_ref.fp32_range(y)


def _has_nan(op: str, case: Case) -> bool:
    return bool(np.isnan(_amax_input(op, case)).any())


def _nan_in_swiglu_gradient(op: str, case: Case) -> bool:
    """A NaN among what SwiGLU's backward cast differentiates (x, its sf, grad_out): the gradient it casts
    then holds a NaN in that row's blocks."""
    return any(bool(torch.isnan(case.inputs[k].float()).any()) for k in ("x", "x_sf", "grad_out")
               if k in case.inputs)


def _has_inf(op: str, case: Case) -> bool:
    return bool(np.isinf(_amax_input(op, case)).any())


def _subnormal_sf(op: str, case: Case) -> bool:
    from tkverify.adapters.tile_kernels import sf_as_fp32

    x, sf = case.inputs["x"], case.inputs["sf"]
    blocks = -(-x.shape[-1] // case.params["num_per_channels"]) if x.dim() else 0
    sf = sf_as_fp32(sf, blocks).abs()
    return bool(((sf > 0) & (sf < torch.finfo(torch.float32).tiny)).any())


def _empty(op: str, case: Case) -> bool:
    return any(isinstance(t, torch.Tensor) and t.numel() == 0 for t in case.inputs.values())


def _sinkhorn_m8(op: str, case: Case) -> bool:
    return case.inputs["x"].shape[-1] == 8


def _without_post(op: str, case: Case) -> bool:
    return case.params["post_mult"] == 0.0


def _mhc_m5_or_m6(op: str, case: Case) -> bool:
    return case.inputs["x"].shape[-2] in (5, 6)  # the m of G11's cases


def _k_reaches_neg_inf(op: str, case: Case) -> bool:
    """A row whose k picks reach its -inf scores: fewer than k of them above -inf (G8's cases: [[-inf, -inf]],
    k 2, and [[1.12, -inf]], k 2)."""
    scores = case.inputs["scores"]
    return bool(scores.numel()) and bool(((~torch.isneginf(scores)).sum(dim=-1) < case.params["k"]).any())


def _e5m6_nan(op: str, case: Case) -> bool:
    return case.params["fmt"] == "e5m6" and _has_nan(op, case)


def _inf_in_x(op: str, case: Case) -> bool:
    return bool(torch.isinf(case.inputs["x"]).any())


def _clamped_nan(op: str, case: Case) -> bool:
    return case.params.get("clamp") is not None and bool(torch.isnan(case.inputs["x"].float()).any())


def _pre_apply_mix_small_tile(op: str, case: Case) -> bool:
    """2.1.0's pre_apply_mix backward tiles the hidden axis by gcd(1024, H) (its wrapper's block size): the
    failing cases had tiles of 2 to 16 elements (H 2, 4, 8, 16); H 1 and H >= 32 passed."""
    return 2 <= math.gcd(1024, case.inputs["x"].shape[-1]) <= 16


def _mhc_m(case: Case, name: str, axis: int) -> int:
    return case.inputs[name].shape[axis]


def _head_mix_m2(op: str, case: Case) -> bool:
    return _mhc_m(case, "mixes", -1) == 2


def _post_m_not_4(op: str, case: Case) -> bool:
    return _mhc_m(case, "residual", -2) != 4


def _no_token_some_rows(op: str, case: Case) -> bool:
    return case.inputs["x"].shape[0] == 0 and case.params["num_expanded_rows"] > 0


def _nan_score(op: str, case: Case) -> bool:
    return bool(torch.isnan(case.inputs["scores"]).any())


def _nan_or_inf_in_x(op: str, case: Case) -> bool:
    return bool((~torch.isfinite(case.inputs["x"].float())).any())


def _nan_x_sf(op: str, case: Case) -> bool:
    return bool(torch.isnan(case.inputs["x_sf"].float()).any())


def _one_row_hidden_32(op: str, case: Case) -> bool:
    """G21's one case: one row, H = 32 (where else 1.0.0 finds no layout is not measured)."""
    return tuple(case.inputs["grad_out"].shape) == (1, 32)


def _non_finite_norm_input(op: str, case: Case) -> bool:
    """A NaN or infinity in x or the residual: the normalised row holds NaN (inf / inf, inf * 0) in its blocks."""
    return any(bool((~torch.isfinite(case.inputs[k].float())).any()) for k in ("x", "residual")
               if case.inputs.get(k) is not None)


def _reduce_width_not_scanned_good(op: str, case: Case) -> bool:
    """F21's widths: any but those the size scan of F15 saw compile (8, 16, 24, 32, 64, 128); 35 and 48 fail.
    Only its one error text is excused, so a width wrongly included here hides no other failure."""
    return case.inputs["out_mul_splitted"].shape[-1] not in (8, 16, 24, 32, 64, 128)


def _hidden_not_vector(op: str, case: Case) -> bool:
    """F20's widths: a hidden size not a multiple of 8 bf16 (one 16-byte copy), or 8 itself; 1, 7 and 8 fail with
    its error."""
    hidden = _mhc_m(case, "initial_residual", -1)
    return hidden % 8 != 0 or hidden == 8


def _head_mix_m_not_compiling(op: str, case: Case) -> bool:
    """F18's layout error: m = 5 and 6 (m = 1, 2, 3, 4 and 8 compile)."""
    return _mhc_m(case, "mixes", -1) not in (1, 2, 3, 4, 8)


def _m_not_power_of_two(op: str, case: Case) -> bool:
    """pre_big_fuse's m (residual (b, m, H)) not a power of two: its reduction over m needs one (the XOR-butterfly
    error says so); m = 3 and 5 fail with tokens and without."""
    m = _mhc_m(case, "residual", -2)
    return m & (m - 1) != 0


def _nan_post_logit(op: str, case: Case) -> bool:
    """A NaN among pre_split_mixes' post logits u[m:2m] = mixes * scale[1] + base (a NaN input, or inf * 0)."""
    m = case.params["m"]
    mixes = case.inputs["mixes"].double()[..., m:2 * m]
    u = mixes * case.inputs["scale"].double()[1] + case.inputs["base"].double()[m:2 * m]
    return bool(torch.isnan(u).any())


def _huge_logit(op: str, case: Case) -> bool:
    """F23's domain: a logit of 2^120 or more, whose score's derivative (1 / (2 sqrt(x))) over the row's score
    sum puts the gradient below the fp32 normal range for cotangents up to 2^4."""
    return bool((case.inputs["logits"] >= 2.0**120).any())


FINDINGS = (
    Finding("F1", "a NaN in a block: the sf skips it (NaN-ignoring amax)", BOTH,
            (*_TOKEN_CASTS, _SWIGLU), _has_nan, outputs=frozenset({"sf"})),
    Finding("F1", "a NaN in a block: the sf skips it (NaN-ignoring amax), in SwiGLU's backward cast", ("2.1.0",),
            ("quant.swiglu_backward_and_per_token_cast",), _nan_in_swiglu_gradient, outputs=frozenset({"sf"})),
    Finding("F2", "a +-inf in a block: sf inf instead of NaN, and with round_sf 1/sf = -inf", BOTH,
            (*_TOKEN_CASTS, _SWIGLU), _has_inf, outputs=frozenset({"sf", "data"})),
    Finding("F3", "a subnormal precomputed sf: zeros become NaN (e4m3) or 6 (e2m1)", BOTH,
            ("quant.per_token_cast_with_precomputed_sf",), _subnormal_sf, outputs=frozenset({"data"})),
    Finding("F4", "an empty batch: zero-size grid launch", BOTH, ("mhc.sinkhorn",), _empty, error=_EMPTY_GRID),
    Finding("F9", "an empty batch: zero-size grid launch", BOTH,
            ("mhc.post", "mhc.pre_apply_mix", "mhc.pre_split_mixes"), _empty, error=_EMPTY_GRID),
    # On an empty batch of width 1 2.1.0's multilayer_recompute fails to compile before it would launch (F20, at
    # any batch), and its reduce_partials_and_rmsnorm at size 35 finds no layout (whether with tokens too is
    # not known: reports/tile-kernels/findings.md, F15).
    Finding("F15", "an empty batch: zero-size grid launch (F9 in the ends of the stack and the fused pre-block)",
            ("2.1.0",), ("mhc.expand_to_mhc", "mhc.head_compute_mix", "mhc.norm_fn", "mhc.reduce_partials_and_rmsnorm",
                         "mhc.multilayer_recompute"), _empty,
            error=rf"{_EMPTY_GRID}|Explicit async copy semantics require cp.async lowering|no available layout found"),
    Finding("F17", "pre_apply_mix backward with a hidden tile of 2 to 16 elements: grad_mix wrong", ("2.1.0",),
            ("mhc.pre_apply_mix",), _pre_apply_mix_small_tile, outputs=frozenset({"mix"}), backward=True),
    Finding("F18", "head_compute_mix backward at m = 2: grad_scale wrong", ("2.1.0",), ("mhc.head_compute_mix",),
            _head_mix_m2, outputs=frozenset({"scale"}), backward=True),
    Finding("F18", "head_compute_mix backward at m = 5 and 6: a TileLang layout error", ("2.1.0",),
            ("mhc.head_compute_mix",), _head_mix_m_not_compiling,
            error=r"Index mapping does not form a bijective transform", backward=True),
    Finding("F19", "post backward at m other than 4: a packed-ABI shape error", ("2.1.0",), ("mhc.post",),
            _post_m_not_4, error=r"mhc_post_bwd_cuda input \w+ shape\[\d\] violates packed ABI constraint",
            backward=True),
    Finding("F20", "multilayer_recompute at hidden 8 or a size not a multiple of 8 (1, 7): a TileLang compile error",
            ("2.1.0",), ("mhc.multilayer_recompute",), _hidden_not_vector,
            error=r"Explicit async copy semantics require cp.async lowering"),
    Finding("F16", "swiglu's clamp turns a NaN into the clamp's bound (a NaN-dropping min/max)", ("2.1.0",),
            ("quant.swiglu",), _clamped_nan, outputs=frozenset({"out"})),
    Finding("F16", "swiglu's clamp turns a NaN into the clamp's bound, in SwiGLU's backward cast", ("2.1.0",),
            ("quant.swiglu_backward_and_per_token_cast",), _clamped_nan,
            outputs=frozenset({"x_grad", "data", "sf"})),
    # 2.1.0 words it "no available layout found", 1.0.0 "Divide by zero".  An empty message matches too: the
    # first report of a 2.1.0 one-token case printed none (its replays print the text).
    Finding("F12", "post_mult = 0: a TileLang compile error", BOTH, ("mhc.pre_split_mixes",), _without_post,
            error=r"^InternalError: (.*no available layout found|.*Divide by zero|\s*$)"),
    Finding("F10", "backward at T = 0: its packed-ABI stride check fails on the empty grad_out", BOTH,
            ("engram.gate",), _empty, error=r"violates packed ABI", backward=True),
    Finding("F13", "per_block_cast, a NaN in a block: the sf skips it (F1's NaN-ignoring amax)", BOTH,
            ("quant.per_block_cast",), _has_nan, outputs=frozenset({"sf"})),
    Finding("G2", "backward at m = 8 asks more shared memory than a block may have", ("1.0.0",),
            ("mhc.sinkhorn",), _sinkhorn_m8, error=r"dynamic shared memory size", backward=True),
    Finding("G3", "a NaN score: indices outside [0, E)", ("1.0.0",), ("moe.topk_gate",),
            lambda op, case: bool(torch.isnan(case.inputs["scores"]).any()), outputs=frozenset({"indices"})),
    Finding("G8", "k reaching a row's -inf scores: an index repeated", ("1.0.0",), ("moe.topk_gate",),
            _k_reaches_neg_inf, outputs=frozenset({"indices"})),
    Finding("G10", "e5m6 with a NaN in a block: the NaN element becomes -0 and the sf skips it", ("1.0.0",),
            _TOKEN_CASTS, _e5m6_nan, outputs=frozenset({"sf", "data"})),
    Finding("G11", "pre_apply_mix at m = 5 or 6: a TileLang compile error", ("1.0.0",), ("mhc.pre_apply_mix",),
            _mhc_m5_or_m6, error=r"used before definition"),
    Finding("G12", "expand_to_fused (with or without sf) with no token: rows left unwritten (not zero)", ("1.0.0",),
            ("moe.expand_to_fused", "moe.expand_to_fused_with_sf"), _no_token_some_rows,
            outputs=frozenset({"out", "sf"})),
    Finding("F1", "a NaN in a block: the sf skips it (NaN-ignoring amax), in the norm's cast (a NaN from an "
            "infinity in the row)", ("2.1.0",), ("quant.norm_forward_and_per_token_cast",), _non_finite_norm_input,
            outputs=frozenset({"sf"})),
    Finding("F21", "reduce_partials_and_rmsnorm at widths 35 and 48: a TileLang layout error, with tokens too",
            ("2.1.0",), ("mhc.reduce_partials_and_rmsnorm",), _reduce_width_not_scanned_good,
            error=r"no available layout found"),
    Finding("F15", "an empty batch: zero-size grid launch, or at m not a power of two (3, 5; with tokens too) a "
            "compile error (pre_big_fuse)", ("2.1.0",), ("mhc.pre_big_fuse",),
            lambda op, case: _empty(op, case) or _m_not_power_of_two(op, case),
            error=rf"{_EMPTY_GRID}|no available layout found|XOR-butterfly AllReduce requires logical_width"),
    Finding("F1", "a NaN in a block: the sf skips it (NaN-ignoring amax), so cast_back returns numbers for it",
            ("2.1.0",), ("quant.per_token_cast_and_cast_back",), _has_nan, outputs=frozenset({"out"})),
    Finding("F2", "a +-inf in a block: with round_sf 1/sf = -inf, so cast_back returns infinities for NaN",
            ("2.1.0",), ("quant.per_token_cast_and_cast_back",), _has_inf, outputs=frozenset({"out"})),
    Finding("F13", "per_block_cast_with_sf_only, a NaN in a block: the sf skips it (G18 on 2.1.0)", ("2.1.0",),
            ("quant.per_block_cast_with_sf_only",), _has_nan, outputs=frozenset({"sf"})),
    Finding("F2", "per_block_cast, a +-inf in a block: sf inf instead of NaN (G14 on 2.1.0)", ("2.1.0",),
            ("quant.per_block_cast",), _inf_in_x, outputs=frozenset({"sf", "data"})),
    Finding("F24", "pre_split_mixes with post_mult = 0: post 0 where a NaN logit makes it NaN", ("2.1.0",),
            ("mhc.pre_split_mixes",), lambda op, case: _without_post(op, case) and _nan_post_logit(op, case),
            outputs=frozenset({"post"})),
    Finding("F23", "topk_gate_scored backward: a gradient below the fp32 normal range flushed to zero", ("2.1.0",),
            ("moe.topk_gate_scored",), _huge_logit, outputs=frozenset({"logits"}), backward=True),
    Finding("G14", "per_block_cast, a +-inf in a block: sf inf instead of NaN, and with round_sf data +-448 "
            "(F2 in the block cast)", ("1.0.0",), ("quant.per_block_cast",), _inf_in_x, outputs=frozenset({"sf", "data"})),
    Finding("F15", "an empty batch: zero-size grid launch (1.0.0's fused pre-block, G15)", ("1.0.0",),
            ("mhc.norm_fn", "mhc.reduce_partials_and_rmsnorm"), _empty, error=_EMPTY_GRID),
    Finding("G16", "aux_fi with no token: fi 0 where 0 / 0 is NaN", ("1.0.0",), ("moe.aux_fi",),
            lambda op, case: case.inputs["topk_idx"].shape[0] == 0, outputs=frozenset({"fi"})),
    Finding("G17", "a NaN score: its group is not ranked first (the total order's NaN above +inf)", ("1.0.0",),
            ("moe.topk_sum_and_topk_group_idx",), _nan_score, outputs=frozenset({"group_idx"})),
    Finding("G18", "per_block_cast_with_sf_only, a NaN in a block: the sf skips it (F13)", ("1.0.0",),
            ("quant.per_block_cast_with_sf_only",), _has_nan, outputs=frozenset({"sf"})),
    Finding("G19", "per_channel_cast_fused, a NaN or +-inf in a channel: a finite or infinite sf where NaN (F1, F2)",
            ("1.0.0",), ("quant.per_channel_cast_fused",), _nan_or_inf_in_x, outputs=frozenset({"sf", "data"})),
    Finding("G20", "per_block_cast_lossless with no token: a TileLang layout error", ("1.0.0",),
            ("quant.per_block_cast_lossless",), _empty, error=r"no available layout found"),
    Finding("G20", "per_block_cast_lossless, a NaN input sf: finite codes and sf where NaN", ("1.0.0",),
            ("quant.per_block_cast_lossless",), _nan_x_sf, outputs=frozenset({"sf", "data"})),
    Finding("G21", "swiglu_backward_and_per_token_cast at one row of H 32: a TileLang layout error", ("1.0.0",),
            ("quant.swiglu_backward_and_per_token_cast",), _one_row_hidden_32, error=r"no available layout found"),
)


def known(release: str | None, case: Case, failure: Failure) -> str | None:
    """The id and title of the finding that explains `failure` on `case`, or None."""
    for f in FINDINGS:
        if f.explains(release, case, failure):
            return f"{f.id} ({FINDINGS_FILE}): {f.title}"
    return None
