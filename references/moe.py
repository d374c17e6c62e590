"""Oracles for the MoE routing operators."""

from __future__ import annotations

import dataclasses

import numpy as np
import torch

from references import as_float64, exact_sum  # noqa: F401  (exact_sum: moe.exact_sum for its users)
from references.quant import tma_padded_rows  # the sf layout is defined once, with the scale factors


def topk_gate(scores: torch.Tensor | np.ndarray, k: int) -> np.ndarray:
    """Indices of the k largest scores of each row, int64 (T, k).

    The order is total: every NaN (whatever its sign or payload) is greater
    than +inf, finite values come in descending order, -inf is last, and
    -0.0 equals +0.0.  Equal scores are ordered by index, lowest first.

    The ranking is written out as explicit sort keys rather than delegated to
    a sort's NaN and stability conventions, so that it stays independent of
    ``torch.sort``, which the operator's contract is phrased in.
    """
    values = as_float64(scores)
    if values.ndim != 2:
        raise ValueError(f"scores must be 2-D (T, E), got shape {values.shape}")
    num_experts = values.shape[1]
    if not 0 <= k <= num_experts:
        raise ValueError(f"k must be in [0, E={num_experts}], got {k}")

    is_nan = np.isnan(values)
    # Ascending keys, most significant last (np.lexsort's convention):
    nan_after_numbers = ~is_nan  # False (a NaN) sorts first
    # Negated for a descending order; NaNs get a dummy key; "+ 0.0" turns -0.0
    # into +0.0 so the two zeros are one key.
    descending_value = np.where(is_nan, 0.0, -values) + 0.0
    lower_index_first = np.broadcast_to(np.arange(num_experts), values.shape)
    order = np.lexsort((lower_index_first, descending_value, nan_after_numbers), axis=-1)
    return np.ascontiguousarray(order[:, :k], dtype=np.int64)


# -- the routing chain: group_count, fused_mapping, expand_to_fused, reduce_fused, normalize_weight
#
# Integer outputs are int32 NumPy arrays; data movement returns CPU tensors of
# the input's dtype holding the moved bits (so they compare bitwise, NaN
# payloads included); sums and quotients are float64.

# The constant normalize_weight adds to the sum of the weights (docs/contract/moe.md#moe.normalize_weight).
NORMALIZE_EPS = 1e-20

# Integer views of each element width: rows are moved as raw bits.
_BITS_VIEW = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def _as_int64(idx: torch.Tensor | np.ndarray) -> np.ndarray:
    if isinstance(idx, torch.Tensor):
        return idx.detach().to("cpu", torch.int64).numpy()
    return np.asarray(idx, dtype=np.int64)


def align_up(n: np.ndarray | int, alignment: int) -> np.ndarray | int:
    """The smallest multiple of `alignment` that is >= n."""
    return -(-n // alignment) * alignment


def group_count(idx: torch.Tensor | np.ndarray, num_groups: int) -> np.ndarray:
    """out[g] = the number of entries of idx equal to g, for g in [0, num_groups): int32 (num_groups,).

    Negative entries (masked slots) equal no group, and neither do entries
    >= num_groups: both are simply not counted.
    """
    flat = _as_int64(idx).ravel()
    counts = np.zeros(num_groups, dtype=np.int64)
    np.add.at(counts, flat[(flat >= 0) & (flat < num_groups)], 1)
    return counts.astype(np.int32)


def fused_mapping(
    topk_idx: torch.Tensor | np.ndarray, num_experts: int, alignment: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, int]:
    """The expert-sorted layout of the (token, slot) pairs, from its definition.

    Expert e owns the rows [start[e], start[e] + count[e]) of the fused layout,
    count[e] the number of pairs routed to it; start[0] = 0 and each segment,
    padded up to a multiple of `alignment`, is followed by the next:
    start[e + 1] = start[e] + align_up(count[e]).  Inside a segment the pairs
    come in (token, slot) order, i.e. by their flat index t * K + k.  Pairs
    with a negative expert take no row.

    Returns (pos_to_token, pos_to_token_topk, token_topk_to_pos, expert_start,
    expert_end, N): int32 arrays of shapes (N,), (N,), (T, K), (E,), (E,)
    and the python int N = sum_e align_up(count[e]).  pos_to_token[p] = t and
    pos_to_token_topk[p] = t * K + k for the pair at row p, -1 on padding rows;
    token_topk_to_pos[t, k] = p, or -1 for a dropped pair; expert_end[e] =
    start[e] + count[e] (the end of the real rows, before the padding).
    """
    idx = _as_int64(topk_idx)
    if idx.ndim != 2:
        raise ValueError(f"topk_idx must be 2-D (T, K), got shape {idx.shape}")
    if (idx >= num_experts).any():
        raise ValueError(f"topk_idx holds experts >= num_experts={num_experts}")
    num_tokens, k = idx.shape
    flat = idx.ravel()
    counts = group_count(idx, num_experts).astype(np.int64)
    padded = align_up(counts, alignment)
    expert_start = np.cumsum(padded) - padded
    num_rows = int(padded.sum())
    pos_to_token = np.full(num_rows, -1, dtype=np.int64)
    pos_to_token_topk = np.full(num_rows, -1, dtype=np.int64)
    token_topk_to_pos = np.full(num_tokens * k, -1, dtype=np.int64)
    for expert in np.flatnonzero(counts):
        pairs = np.flatnonzero(flat == expert)  # ascending flat index: (token, slot) order
        rows = expert_start[expert] + np.arange(pairs.size)
        pos_to_token[rows] = pairs // k
        pos_to_token_topk[rows] = pairs
        token_topk_to_pos[pairs] = rows
    return (
        pos_to_token.astype(np.int32),
        pos_to_token_topk.astype(np.int32),
        token_topk_to_pos.reshape(num_tokens, k).astype(np.int32),
        expert_start.astype(np.int32),
        (expert_start + counts).astype(np.int32),
        num_rows,
    )


def _bits(t: torch.Tensor) -> np.ndarray:
    """A copy of t's elements as integers of their width (logical row-major order)."""
    t = t.detach().cpu()
    return t.clone(memory_format=torch.contiguous_format).view(_BITS_VIEW[t.element_size()]).numpy()


def _tensor_of_bits(bits: np.ndarray, dtype: torch.dtype) -> torch.Tensor:
    # Allocated by torch and written by NumPy (torch.from_numpy keeps the zero
    # strides NumPy gives empty arrays, which dtype views reject).
    out = torch.empty(bits.shape, dtype=_BITS_VIEW[torch.empty((), dtype=dtype).element_size()])
    out.numpy()[...] = bits
    return out.view(dtype)


def _placed_pairs(token_topk_to_pos: torch.Tensor | np.ndarray, num_rows: int) -> tuple[np.ndarray, np.ndarray]:
    """(token, row) of every pair whose position is a row of the fused layout, 0 <= pos < num_rows."""
    pos = _as_int64(token_topk_to_pos)
    token, _slot = np.nonzero((pos >= 0) & (pos < num_rows))
    return token, pos[token, _slot]


def _scatter_rows(src: torch.Tensor, token: np.ndarray, rows: np.ndarray, num_rows: int) -> torch.Tensor:
    """(num_rows, width) of src's dtype: row rows[i] holds src[token[i]], other rows zero bits."""
    bits = _bits(src)
    out = np.zeros((num_rows, src.shape[1]), dtype=bits.dtype)
    out[rows] = bits[token]
    return _tensor_of_bits(out, src.dtype)


def expand_to_fused(
    x: torch.Tensor,
    token_topk_to_pos: torch.Tensor | np.ndarray,
    num_expanded_rows: int,
    x_sf: torch.Tensor | None = None,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """out[pos] = x[t] for every pair (t, k) with 0 <= pos = token_topk_to_pos[t, k] < N; other rows zero.

    Bits move unchanged (any dtype).  With x_sf (T, G), its rows move the same
    way and the result is (out, out_sf), out_sf (N, G) with zero padding rows;
    both are row-major here (the spec judges the layout an implementation
    must give the sf).
    """
    token, rows = _placed_pairs(token_topk_to_pos, num_expanded_rows)
    out = _scatter_rows(x, token, rows, num_expanded_rows)
    if x_sf is None:
        return out
    return out, _scatter_rows(x_sf, token, rows, num_expanded_rows)


def _weighted_rows(x, topk_weights, token_topk_to_pos, x_sf):
    """For each slot k: (valid (T,), w_k * x[pos] (T, H), factors) exactly in float64.

    Every product is exact in float64: w (24 bits) times a bf16 or fp32 x
    (8 or 24 bits), or times an e4m3 q (4 bits) and an fp32 sf (24 bits),
    needs at most 52 significant bits.
    """
    values = as_float64(x)
    if x_sf is not None:
        values_sf = as_float64(x_sf).reshape(-1)
    weights = as_float64(topk_weights)
    pos = _as_int64(token_topk_to_pos)
    num_rows = values.shape[0]
    for k in range(pos.shape[1]):
        valid = (pos[:, k] >= 0) & (pos[:, k] < num_rows)
        rows = np.where(valid, pos[:, k], 0)
        w = weights[:, k : k + 1]
        with np.errstate(invalid="ignore", over="ignore"):
            if num_rows == 0:
                term = np.zeros((pos.shape[0], values.shape[1]))
                factors = [np.broadcast_to(w, term.shape)]
            elif x_sf is None:
                term = w * values[rows]
                factors = [np.broadcast_to(w, term.shape), values[rows]]
            else:
                sf = values_sf[rows][:, None]
                term = w * values[rows] * sf
                factors = [np.broadcast_to(w, term.shape), values[rows], np.broadcast_to(sf, term.shape)]
        yield valid, np.where(valid[:, None], term, 0.0), factors


def reduce_fused(
    x: torch.Tensor, topk_weights: torch.Tensor, token_topk_to_pos: torch.Tensor, x_sf: torch.Tensor | None = None
) -> np.ndarray:
    """out[t] = sum_k w[t, k] * x[pos(t, k)] over the slots with 0 <= pos < N, exactly: float64 (T, H).

    With an e4m3 x and its per-row sf (N, 1), x[p] is q[p] * sf[p].  A slot
    whose position is not a row contributes nothing (not 0 * its weight, which
    would turn a NaN weight of a masked slot into a NaN sum).
    """
    shape = (token_topk_to_pos.shape[0], x.shape[1])
    return exact_sum([term for _, term, _ in _weighted_rows(x, topk_weights, token_topk_to_pos, x_sf)], shape)


@dataclasses.dataclass(frozen=True)
class ReduceTerms:
    """reduce_fused's exact terms p_k = w * x[pos] (or w * q * sf), and what bounds a working-precision
    sum of them.  Per slot, stacked (K, T, H), 0 where the slot's position is not a row:

    terms           the exact terms;
    partial         the largest magnitude of a product of some of each term's factors (|w q|, |q sf|,
                    |w sf|, |w q sf|; the term's own for two factors);
    and per output element (T, H):
    count           the number of terms summed;
    largest_factor  the largest |factor| of any of them.
    """

    terms: np.ndarray
    partial: np.ndarray
    count: np.ndarray
    largest_factor: np.ndarray

    @property
    def magnitude(self) -> np.ndarray:
        """sum_k |p_k|, slot by slot."""
        total = np.zeros(self.count.shape)
        for term in self.terms:
            total += np.abs(term)
        return total


def reduce_fused_terms(
    x: torch.Tensor, topk_weights: torch.Tensor, token_topk_to_pos: torch.Tensor, x_sf: torch.Tensor | None = None
) -> ReduceTerms:
    """`ReduceTerms` of reduce_fused on these inputs; the spec turns them into an error bound
    (`tkverify.policies.summation_error`) and the reach of its partial sums (`signed_reach`)."""
    shape = (token_topk_to_pos.shape[0], x.shape[1])
    terms, partial = [], []
    count, largest_factor = np.zeros(shape), np.zeros(shape)
    with np.errstate(invalid="ignore", over="ignore"):
        for valid, term, factors in _weighted_rows(x, topk_weights, token_topk_to_pos, x_sf):
            sizes = [np.abs(f) for f in factors]
            pairs = [sizes[i] * sizes[j] for i in range(len(sizes)) for j in range(i + 1, len(sizes))]
            terms.append(term)
            partial.append(np.where(valid[:, None], np.maximum.reduce([np.abs(term), *pairs]), 0.0))
            count += valid[:, None]
            largest_factor = np.maximum(largest_factor, np.where(valid[:, None], np.max(sizes, axis=0), 0.0))
    stacked = (np.stack(terms), np.stack(partial)) if terms else (np.zeros((0, *shape)),) * 2
    return ReduceTerms(*stacked, count, largest_factor)


def reduce_fused_magnitudes(
    x: torch.Tensor, topk_weights: torch.Tensor, token_topk_to_pos: torch.Tensor, x_sf: torch.Tensor | None = None
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(sum_k |p_k|, the number of terms summed, the largest |factor| of any term) per output
    element (T, H): what bounds the error of a working-precision reduce_fused."""
    t = reduce_fused_terms(x, topk_weights, token_topk_to_pos, x_sf)
    return t.magnitude, t.count, t.largest_factor


def normalize_weight(topk_weights: torch.Tensor | np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(denom, w / denom) with denom = 1e-20 + sum_k w[t, k], exactly: float64 (T,) and (T, K)."""
    w = as_float64(topk_weights)
    denom = exact_sum([np.full(w.shape[0], NORMALIZE_EPS), *(w[:, k] for k in range(w.shape[1]))], (w.shape[0],))
    with np.errstate(invalid="ignore", divide="ignore"):
        return denom, w / denom[:, None]


# -- sf layouts (docs/contract/quant.md#scale-factors) ----------------------------


def store_tma_column_major(values: torch.Tensor) -> torch.Tensor:
    """`values` (rows, cols) stored TMA-aligned column-major on their device (padding rows zero)."""
    rows, cols = values.shape
    storage = torch.zeros((cols, tma_padded_rows(rows, values.dtype)), dtype=values.dtype, device=values.device)
    storage[:, :rows] = values.T
    return storage.T[:rows]
