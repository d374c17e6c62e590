"""The MoE routing chain end to end, against the float64 oracle of the whole routed computation.

    topk_gate -> normalize_weight -> fused_mapping -> expand_to_fused
              -> a per-expert transform -> reduce_fused

A rank of an expert-parallel layer holds the experts [lo, hi): the slots of
other experts are masked (-1) before the mapping, while the weights are
normalised over all K slots.  Each expert applies a transform to its rows:
the identity (bf16 through, bf16 out) or a per-expert scalar s[e] (an fp32
product, fp32 out).  The exact result is

    out[t] = sum over local slots k of  w[t, k] / (1e-20 + sum_j w[t, j]) * s[e(t, k)] * x[t].

The bound composes the spec's ones (tkverify/specs/moe.py):
* the implementation's denom d is within e_d = gamma_K (sum|w| + 1e-20) + ...
  of the exact D, so w / d = (w / D)(D / d) with |D / d - 1| <= rho / (1 - rho),
  rho = e_d / D; the division adds gamma_2, so each normalised weight carries
  a relative error zeta <= (1 + gamma_2) / (1 - rho) - 1 (and 2^-150 absolute);
* the transform rounds s * x once (r = 1), the reduce's product once more;
* the reduce adds n <= K terms: summation_error(sum|p|, n, r, term_error=zeta),
  and the output is rounded once to bf16 (identity) or not at all (fp32).
So the whole chain is judged by the same `summation` policy as reduce_fused.

The torch implementation runs everywhere (on CUDA when there is one); the
TileLang kernels (kernels.moe) join on a CUDA machine where they import.
"""

from __future__ import annotations

import importlib
import importlib.util
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from references import moe as ref
from tkverify.policies import FP32_UNDERFLOW, ErrorBound, gamma, summation, summation_error
from tkverify.specs.moe import normalize_denom_bound

CHAIN_OPS = ("topk_gate", "normalize_weight", "fused_mapping", "expand_to_fused", "reduce_fused", "group_count")

# (T, E, K, alignment, H, local experts [lo, hi))
CHAIN_SHAPES = [
    (0, 8, 2, 16, 16, (0, 8)),
    (1, 8, 2, 1, 16, (0, 8)),
    (33, 1, 1, 128, 8, (0, 1)),
    (7, 16, 4, 16, 64, (4, 12)),
    (129, 64, 6, 64, 128, (0, 32)),
    (513, 256, 8, 128, 64, (64, 192)),
    (1001, 384, 9, 16, 32, (0, 384)),
    (65, 32, 8, 1, 7, (31, 32)),  # one local expert: most slots masked, some tokens with none
]
TRANSFORMS = ("identity", "per_expert_scale")


def implementation(name: str) -> SimpleNamespace:
    """The chain's functions of one implementation and the device it runs on (skips when it cannot run)."""
    if name == "torch":
        module = importlib.import_module("kernels.torch.moe")
        device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    else:
        if not torch.cuda.is_available():
            pytest.skip("the tilelang implementation needs CUDA, which this machine lacks")
        if importlib.util.find_spec("tilelang") is None:
            pytest.skip("the tilelang implementation needs the module 'tilelang', which is not installed")
        try:
            module = importlib.import_module("kernels.moe")
        except ImportError as e:
            pytest.skip(f"kernels.moe does not import: {e}")
        device = torch.device("cuda")
    missing = [op for op in CHAIN_OPS if not hasattr(module, op)]
    if missing:
        pytest.skip(f"{module.__name__} lacks {', '.join(missing)}")
    return SimpleNamespace(device=device, **{op: getattr(module, op) for op in CHAIN_OPS})


def chain_inputs(num_tokens: int, num_experts: int, hidden: int, seed: int) -> dict[str, torch.Tensor]:
    """Router scores, the router's fp32 probabilities, x (bf16) and the per-expert scalars (CPU)."""
    g = torch.Generator().manual_seed(seed)
    scores = torch.randn(num_tokens, num_experts, generator=g)
    magnitude = torch.exp2(torch.randint(-3, 4, (num_experts,), generator=g).float())
    sign = torch.where(torch.rand(num_experts, generator=g) < 0.3, -1.0, 1.0)
    return {
        "scores": scores,
        "probs": torch.softmax(scores, dim=1),
        "x": torch.randn(num_tokens, hidden, generator=g).bfloat16(),
        "scale": sign * magnitude * (1 + torch.rand(num_experts, generator=g)),
    }


def local_slots(topk_idx: torch.Tensor, local: tuple[int, int]) -> torch.Tensor:
    """topk_idx with the slots of experts outside [lo, hi) masked (-1)."""
    lo, hi = local
    return torch.where((topk_idx >= lo) & (topk_idx < hi), topk_idx, -1)


def expert_of_rows(expert_start: torch.Tensor, expert_end: torch.Tensor, num_rows: int) -> torch.Tensor:
    """int64 (N,): the expert owning each row of the fused layout, -1 on padding rows."""
    owner = torch.full((num_rows + 1,), -1, dtype=torch.int64, device=expert_start.device)
    counts = (expert_end - expert_start).long()
    experts = torch.arange(counts.numel(), device=counts.device).repeat_interleave(counts)
    rows = torch.repeat_interleave(expert_start.long(), counts)
    offsets = torch.arange(rows.numel(), device=rows.device) - torch.repeat_interleave(
        torch.cumsum(counts, 0) - counts, counts)
    owner[rows + offsets] = experts
    return owner[:num_rows]


def run_chain(ops: SimpleNamespace, inputs: dict, k: int, num_experts: int, alignment: int,
              local: tuple[int, int], transform: str) -> dict[str, torch.Tensor]:
    dev = {name: t.to(ops.device) for name, t in inputs.items()}
    topk_idx = ops.topk_gate(dev["scores"], k)
    weights = torch.gather(dev["probs"], 1, topk_idx).contiguous()
    denom, normalized = ops.normalize_weight(weights)
    masked = local_slots(topk_idx, local).contiguous()
    _, _, token_topk_to_pos, expert_start, expert_end, num_rows = ops.fused_mapping(masked, num_experts, alignment)
    counts = ops.group_count(masked, num_experts)
    expanded = ops.expand_to_fused(dev["x"], token_topk_to_pos, num_rows)
    if transform == "identity":
        transformed = expanded
    else:
        owner = expert_of_rows(expert_start, expert_end, num_rows)
        row_scale = torch.where(owner >= 0, dev["scale"][owner.clamp(min=0)], 0.0)
        transformed = (expanded.float() * row_scale[:, None]).contiguous()
    out = ops.reduce_fused(transformed, normalized, token_topk_to_pos)
    return {"out": out.cpu(), "denom": denom.cpu(), "counts": counts.cpu(),
            "segment_sizes": (expert_end - expert_start).cpu(), "num_rows": num_rows}


def chain_oracle(inputs: dict, k: int, local: tuple[int, int], transform: str) -> ErrorBound:
    """The exact routed output and its error bound (module docstring), from the oracles alone."""
    topk_idx = torch.from_numpy(ref.topk_gate(inputs["scores"], k))
    weights = torch.gather(inputs["probs"], 1, topk_idx)
    denom_bound = normalize_denom_bound(weights)
    w = weights.double().numpy()
    normalized = w / denom_bound.exact[:, None]
    is_local = local_slots(topk_idx, local).numpy() >= 0
    scale = inputs["scale"].double().numpy() if transform == "per_expert_scale" else np.ones(inputs["scale"].shape)
    x = inputs["x"].double().numpy()
    # Term (t, k): normalized[t, k] * s[e(t, k)] * x[t]; summed over the local slots.
    coefficient = np.where(is_local, normalized * scale[topk_idx.numpy()], 0.0)  # (T, K)
    terms = [coefficient[:, j : j + 1] * x for j in range(k)]
    exact = ref.exact_sum(terms, x.shape)
    magnitude = np.abs(coefficient).sum(axis=1, keepdims=True) * np.abs(x)
    num_terms = is_local.sum(axis=1, keepdims=True)
    with np.errstate(divide="ignore", invalid="ignore"):
        rho = np.where(denom_bound.exact > 0, denom_bound.error / denom_bound.exact, np.inf)
    zeta = ((1 + gamma(2)) / (1 - rho) - 1)[:, None]
    roundings = 1 if transform == "identity" else 2
    largest = np.abs(scale).max(initial=0.0) * np.abs(x)
    absolute = num_terms * FP32_UNDERFLOW * (1 + (1 + gamma(2)) * largest)
    error = summation_error(magnitude, num_terms, roundings_per_term=roundings, term_error=zeta, absolute=absolute)
    return ErrorBound(exact, error, "bf16" if transform == "identity" else "fp32")


@pytest.mark.parametrize("transform", TRANSFORMS)
@pytest.mark.parametrize("shape", CHAIN_SHAPES, ids=lambda s: "T{}-E{}-K{}-a{}-H{}-local{}_{}".format(*s[:5], *s[5]))
@pytest.mark.parametrize("impl", ["torch", pytest.param("tilelang", marks=pytest.mark.gpu)])
def test_routed_chain_matches_the_float64_oracle(impl, shape, transform):
    ops = implementation(impl)
    num_tokens, num_experts, k, alignment, hidden, local = shape
    inputs = chain_inputs(num_tokens, num_experts, hidden, seed=num_tokens * 1009 + num_experts)
    got = run_chain(ops, inputs, k, num_experts, alignment, local, transform)
    # The mapping's segments hold exactly the pairs group_count counts.
    assert torch.equal(got["counts"], got["segment_sizes"])
    assert got["num_rows"] == int(ref.align_up(got["counts"].long(), alignment).sum())
    expected = chain_oracle(inputs, k, local, transform)
    verdict = summation().compare("out", got["out"], expected)
    assert verdict.passed, verdict.message


def test_chain_bound_is_tight_enough_to_catch_a_lost_expert():
    """The bound must not hide a routing error: an oracle for a rank without expert 63 disagrees."""
    ops = implementation("torch")
    num_tokens, num_experts, k, alignment, hidden = 129, 64, 6, 64, 16
    inputs = chain_inputs(num_tokens, num_experts, hidden, seed=5)
    for transform in TRANSFORMS:
        got = run_chain(ops, inputs, k, num_experts, alignment, (0, 64), transform)
        assert summation().compare("out", got["out"], chain_oracle(inputs, k, (0, 64), transform)).passed
        verdict = summation().compare("out", got["out"], chain_oracle(inputs, k, (0, 63), transform))
        assert not verdict.passed and "fail" in verdict.message


@pytest.mark.parametrize("sf_options", [{}, {"round_sf": True, "use_ue8m0": True},
                                        {"round_sf": True, "use_ue8m0": True, "use_packed_ue8m0": True}],
                         ids=["fp32", "ue8m0", "packed"])
def test_an_empty_column_major_sf_keeps_its_layout_through_expand(sf_options):
    """A rank with no tokens but N > 0 rows: per_token_cast's column-major sf of T = 0 must give a
    column-major out_sf (a grouped GEMM reads it by TMA), not a row-major one."""
    from kernels.torch import moe as eager_moe
    from kernels.torch import quant as eager_quant

    x = torch.zeros((0, 512), dtype=torch.bfloat16)
    data, sf = eager_quant.per_token_cast(x, "e4m3", 32, use_tma_aligned_col_major_sf=True, **sf_options)
    assert sf.shape[1] >= 2, "one sf column would make the two layouts the same bytes"
    pos = torch.zeros((0, 2), dtype=torch.int32)
    out, out_sf = eager_moe.expand_to_fused(data, pos, 3, x_sf=sf)
    assert out.shape == (3, 512) and not out.view(torch.uint8).any()
    assert out_sf.stride() == (1, eager_moe.tma_padded_rows(3, sf.dtype))
    assert not out_sf.any()
