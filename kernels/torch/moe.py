"""Eager PyTorch MoE routing operators, in working precision, on the inputs' device.

The TileLang kernels of ``kernels.moe`` have exactly these names,
signatures, return conventions and argument checks; the contract is
docs/contract/moe.md.

Signatures
----------
    topk_gate(scores, k) -> topk_idx
    group_count(idx, num_groups) -> counts
    fused_mapping(topk_idx, num_experts, alignment)
        -> (pos_to_token, pos_to_token_topk, token_topk_to_pos, expert_start, expert_end, N)
    expand_to_fused(x, token_topk_to_pos, num_expanded_rows, x_sf=None)
        -> out                  (x_sf is None)
        -> (out, out_sf)        (x_sf given)
    reduce_fused(x, topk_weights, token_topk_to_pos, x_sf=None) -> out
    normalize_weight(topk_weights) -> (denom, weights)

Tensors (T tokens, K slots, E experts, N rows of the fused layout, H hidden)
-------------------------------------------------------------------------
scores             float32 (T, E), contiguous, 1 <= E <= 1024; k in [1, min(32, E)].
topk_idx           int64 (T, K), 1 <= K <= 32; entries in [0, E) pick an
                   expert, negative entries are masked slots (expert
                   parallelism) and take no row.  A row may name an expert
                   twice: each (token, slot) pair is its own row, so the
                   token is expanded twice and its two terms both reduced.
idx                int32 or int64 (T, K) for group_count; entries outside
                   [0, num_groups) are not counted (no error: a kernel could
                   only find them with a device-to-host sync).
counts             int32 (num_groups,); 1 <= num_groups <= 1024.
alignment          int in [1, 1024]: every expert's segment starts at a
                   multiple of it; padding rows hold -1.
pos_to_token       int32 (N,): the token of each row, -1 on padding rows.
pos_to_token_topk  int32 (N,): t * K + k of each row's pair, -1 on padding.
token_topk_to_pos  int32 (T, K): the row of each pair, -1 for masked slots.
expert_start/_end  int32 (E,): expert e's pairs are the rows
                   [expert_start[e], expert_end[e]) in (token, slot) order;
                   its padding runs to expert_start[e + 1] (N after the last);
                   an expert with no pair has expert_start == expert_end and
                   no padding.
N                  a python int, the number of rows: sum_e align_up(count[e]).
x (expand)         (T, H), any 1-, 2- or 4-byte dtype (bf16, fp16, fp32,
                   e4m3, e5m2, int8 (packed e2m1), uint8 (packed e5m6)),
                   contiguous; moved bit for bit.  out: (N, H), same dtype,
                   contiguous, padding rows all zero bits.
x_sf (expand)      the per-token sf of a quantised x: (T, G) float32, uint8
                   (ue8m0) or int32 (packed ue8m0), row-major contiguous or
                   TMA-aligned column-major (stride(0) == 1, stride(1) == T
                   rounded up to a multiple of 16 bytes / element size).
                   out_sf: (N, G), the same dtype and layout (the column-major
                   one padded the same way for N), padding rows zero bits.
x (reduce)         (N, H) bfloat16, float32, or float8_e4m3fn with x_sf: float32
                   (N, 1), one dequant scale per row (x = q * sf; stride(0)
                   must be 1, so both sf layouts serve).  Contiguous.
topk_weights       float32 (T, K), contiguous.
out (reduce)       (T, H): bfloat16 for bf16 and e4m3 x, float32 for fp32 x.
                   out[t] = sum_k w[t, k] * x[token_topk_to_pos[t, k]] over the
                   slots whose position is a row (0 <= pos < N), accumulated
                   in fp32 in slot order k = 0..K-1 from +0, rounded once to
                   the output dtype; a token with no such slot gets zeros.
                   Masked slots are skipped, not multiplied by 0 (their
                   weights may be anything, NaN included).
denom, weights     float32 (T,) and (T, K): denom = sum_k w[t, k] (fp32, slot
                   order) + 1e-20 (as fp32), weights = w / denom (IEEE division).

All tensors of one call on one device; the outputs are on it too.  T may be 0.
Every function validates dtypes, shapes, layouts, devices and limits before it
touches data, raising TypeError (wrong type or dtype) or ValueError (wrong
shape, layout, device or value) naming the argument.  No function writes into
its inputs or takes an output buffer.

N and host synchronisation
--------------------------
fused_mapping returns exactly sized tensors, so it must know N on the host:
it reads the expert counts back once (one device-to-host sync, which also
carries the check that no topk_idx entry is >= num_experts, so that check is
free).  N comes back as a python int because every consumer needs it on the
host anyway - the (N, H) activations of the grouped GEMM, and
expand_to_fused's output, are allocated from it - and a tensor would only
make each of them sync again.  The ops on the hot path (expand_to_fused,
reduce_fused, group_count, normalize_weight) never sync: they take N as an
int or from x.shape, and do not inspect values.  Positions outside [0, N) in
token_topk_to_pos are skipped (a kernel guards each access), so no input
values can make a kernel read or write out of bounds.
"""

from __future__ import annotations

import numbers

import torch

from ._checks import check_contiguous as _check_contiguous, check_rows as _check_rows, check_tensor as _check_tensor

# The limits every topk_gate implementation in tkverify supports.
MAX_EXPERTS = 1024
MAX_K = 32


def _check_topk_gate_args(scores: object, k: object) -> None:
    if not isinstance(scores, torch.Tensor):
        raise TypeError(f"scores must be a torch.Tensor, got {type(scores).__name__}")
    if scores.dtype != torch.float32:
        raise TypeError(f"scores must have dtype torch.float32, got {scores.dtype}")
    if scores.dim() != 2:
        raise ValueError(f"scores must be 2-D (T, E), got shape {tuple(scores.shape)}")
    _check_rows("scores", scores)  # any row stride: each row is read on its own
    num_experts = scores.shape[1]
    if not 1 <= num_experts <= MAX_EXPERTS:
        raise ValueError(f"scores must have 1 <= E <= {MAX_EXPERTS} columns (experts), got E={num_experts}")
    if isinstance(k, bool) or not isinstance(k, numbers.Integral):
        raise TypeError(f"k must be an int, got {type(k).__name__}")
    if not 1 <= k <= min(MAX_K, num_experts):
        raise ValueError(f"k must satisfy 1 <= k <= min({MAX_K}, E={num_experts}), got k={k}")


def topk_gate(scores: torch.Tensor, k: int) -> torch.Tensor:
    """Indices of the k largest scores per row, int64 (T, k), on scores' device.

    A stable descending sort: ties go to the lower index, NaN sorts above
    +inf and -inf below every finite value (docs/contract/moe.md#moe.topk_gate).
    """
    _check_topk_gate_args(scores, k)
    # torch.sort's own NaN and signed-zero order differs by device: on CUDA
    # (torch 2.11, H200) a descending sort puts NaN last, where the CPU puts it
    # first (regression case tests/regressions/moe.topk_gate-nan-first-cuda.json).
    # So sort explicit keys: values with -0 folded into +0 and NaN as +inf, then
    # a stable pass that lifts the NaNs above the +inf they tie with.
    is_nan = torch.isnan(scores)
    by_value = torch.sort(torch.where(is_nan, torch.inf, scores) + 0.0, dim=1, descending=True, stable=True).indices
    nan_first = torch.sort(is_nan.gather(1, by_value).to(torch.uint8), dim=1, descending=True, stable=True).indices
    return by_value.gather(1, nan_first)[:, : int(k)].contiguous()


# -- the routing chain --------------------------------------------------------------

MAX_ALIGNMENT = 1024
INT32_MAX = 2**31 - 1
NORMALIZE_EPS = 1e-20
# Dtypes expand_to_fused moves bit for bit (by integer views of their width).
MOVABLE_DTYPES = (torch.bfloat16, torch.float16, torch.float32, torch.float8_e4m3fn, torch.float8_e5m2,
                  torch.int8, torch.uint8)
SF_DTYPES = (torch.float32, torch.uint8, torch.int32)
REDUCE_DTYPES = (torch.bfloat16, torch.float32, torch.float8_e4m3fn)
TMA_ALIGN_BYTES = 16
_BITS_VIEW = {1: torch.uint8, 2: torch.int16, 4: torch.int32}


def _check_same_device(reference: str, t: torch.Tensor, **others: torch.Tensor | None) -> None:
    for name, other in others.items():
        if other is not None and other.device != t.device:
            raise ValueError(f"{name} is on {other.device}, but {reference} is on {t.device}")


def _check_int(name: str, v: object, low: int, high: int) -> int:
    if isinstance(v, bool) or not isinstance(v, numbers.Integral):
        raise TypeError(f"{name} must be an int, got {type(v).__name__}")
    if not low <= v <= high:
        raise ValueError(f"{name} must be in [{low}, {high}], got {v}")
    return int(v)


def _check_slots(name: str, t: torch.Tensor) -> int:
    """K, the slot count of a (T, K) tensor, within the supported range; T * K must fit int32."""
    num_tokens, k = t.shape
    if not 1 <= k <= MAX_K:
        raise ValueError(f"{name} must have 1 <= K <= {MAX_K} columns (slots), got K={k}")
    if num_tokens * k > INT32_MAX:
        raise ValueError(f"{name} has T*K = {num_tokens * k} pairs, more than int32 positions can address")
    return k


def _align_up(n: torch.Tensor | int, alignment: int) -> torch.Tensor | int:
    return (n + alignment - 1) // alignment * alignment


def _check_group_count_args(idx: object, num_groups: object) -> int:
    _check_tensor("idx", idx, (torch.int32, torch.int64), 2, "(T, K)")
    _check_contiguous("idx", idx)
    _check_slots("idx", idx)
    return _check_int("num_groups", num_groups, 1, MAX_EXPERTS)


def group_count(idx: torch.Tensor, num_groups: int) -> torch.Tensor:
    """int32 (num_groups,): how many entries of idx equal each g in [0, num_groups).

    Negative entries (masked slots) and entries >= num_groups count nowhere.
    """
    num_groups = _check_group_count_args(idx, num_groups)
    flat = idx.reshape(-1).to(torch.int64)
    # Entries outside the groups land in one extra bin, dropped at the end: no
    # boolean indexing, hence no device-to-host sync.
    bins = torch.where((flat >= 0) & (flat < num_groups), flat, num_groups)
    counts = torch.zeros(num_groups + 1, dtype=torch.int64, device=idx.device)
    counts.scatter_add_(0, bins, torch.ones_like(bins))
    return counts[:num_groups].to(torch.int32)


def _check_fused_mapping_args(topk_idx: object, num_experts: object, alignment: object) -> tuple[int, int]:
    _check_tensor("topk_idx", topk_idx, (torch.int64,), 2, "(T, K)")
    _check_contiguous("topk_idx", topk_idx)
    _check_slots("topk_idx", topk_idx)
    num_experts = _check_int("num_experts", num_experts, 1, MAX_EXPERTS)
    alignment = _check_int("alignment", alignment, 1, MAX_ALIGNMENT)
    # The largest N any routing can give: every pair on its own expert, each padded.
    pairs = topk_idx.numel()
    most_rows = pairs + min(pairs, num_experts) * (alignment - 1)
    if most_rows > INT32_MAX:
        raise ValueError(f"topk_idx: T*K = {pairs} pairs with alignment={alignment} may need {most_rows} rows, "
                         f"more than int32 positions can address")
    return num_experts, alignment


def fused_mapping(topk_idx: torch.Tensor, num_experts: int, alignment: int):
    """The (token, slot) pairs sorted by expert into segments aligned to `alignment` (see the module docstring).

    Returns (pos_to_token, pos_to_token_topk, token_topk_to_pos, expert_start,
    expert_end, N): int32 tensors on topk_idx's device and the python int N.
    """
    num_experts, alignment = _check_fused_mapping_args(topk_idx, num_experts, alignment)
    device = topk_idx.device
    num_tokens, k = topk_idx.shape
    flat = topk_idx.reshape(-1)
    # Dropped pairs (negative entries) go to a sentinel expert after the real
    # ones.  A stable sort keeps each expert's pairs in flat-index order, which
    # is (token, slot) order.
    expert = torch.where(flat >= 0, flat, num_experts)
    order = torch.sort(expert, stable=True).indices
    counts = torch.zeros(num_experts + 1, dtype=torch.int64, device=device)
    counts.scatter_add_(0, expert.clamp(max=num_experts), torch.ones_like(expert))
    padded = _align_up(counts[:num_experts], alignment)
    expert_start = torch.cumsum(padded, 0) - padded
    # The one device-to-host sync: N, and whether any entry names an expert beyond E.
    num_rows, too_large = torch.stack([padded.sum(), (flat >= num_experts).sum()]).tolist()
    if too_large:
        raise ValueError(f"topk_idx holds {too_large} entries >= num_experts={num_experts}")

    sorted_expert = expert[order]
    first_of_expert = torch.cumsum(counts, 0) - counts  # index in `order` of each expert's first pair
    rank = torch.arange(order.numel(), device=device) - first_of_expert[sorted_expert]
    # Dropped pairs are written to a spare row N, cut off at the end.
    start_with_spare = torch.cat([expert_start, torch.tensor([num_rows], device=device)])
    row = torch.where(sorted_expert < num_experts, start_with_spare[sorted_expert] + rank, num_rows)
    pos_to_token_topk = torch.full((num_rows + 1,), -1, dtype=torch.int64, device=device)
    pos_to_token_topk[row] = order
    pos_to_token_topk = pos_to_token_topk[:num_rows]
    pos_to_token = torch.where(pos_to_token_topk >= 0, pos_to_token_topk // k, -1)
    token_topk_to_pos = torch.full((num_tokens * k,), -1, dtype=torch.int64, device=device)
    token_topk_to_pos[order] = torch.where(row < num_rows, row, -1)
    return (
        pos_to_token.to(torch.int32),
        pos_to_token_topk.to(torch.int32),
        token_topk_to_pos.reshape(num_tokens, k).to(torch.int32),
        expert_start.to(torch.int32),
        (expert_start + counts[:num_experts]).to(torch.int32),
        int(num_rows),
    )


def tma_padded_rows(rows: int, dtype: torch.dtype) -> int:
    """Rows of a TMA-aligned column-major sf: `rows` rounded up to a multiple of 16 bytes / element size."""
    per_16_bytes = TMA_ALIGN_BYTES // torch.empty((), dtype=dtype).element_size()
    return _align_up(rows, per_16_bytes)


def is_tma_column_major(sf: torch.Tensor) -> bool:
    """Whether a (rows, cols) sf is stored TMA-aligned column-major: stride(0) == 1, stride(1) == padded rows.

    Never true of a row-major contiguous tensor with rows >= 1 (its stride(1)
    is 1, a padded row count is a multiple of at least 4).  A tensor without
    rows has no padded column to measure, yet its layout still decides the
    layout of an output with N > 0 rows (expand_to_fused with T = 0): it is
    column-major when stride(0) == 1 and cols >= 2.  That is what every
    column-major producer gives ((cols, 0) storage transposed: strides (1, 1);
    empty_strided: (1, 0)), and a row-major (0, cols) tensor has stride(0) ==
    cols.  With one column the two layouts cannot be told apart, and need not
    be: they put every element at the same offset.
    """
    rows, cols = sf.shape
    if rows == 0:
        return cols >= 2 and sf.stride(0) == 1
    return sf.stride(0) == 1 and sf.stride(1) == tma_padded_rows(rows, sf.dtype)


def column_major_zeros(rows: int, cols: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A zero (rows, cols) tensor stored TMA-aligned column-major."""
    return torch.zeros((cols, tma_padded_rows(rows, dtype)), dtype=dtype, device=device).T[:rows]


def _check_expand_args(x: object, token_topk_to_pos: object, num_expanded_rows: object, x_sf: object) -> int:
    _check_tensor("x", x, MOVABLE_DTYPES, 2, "(T, H)")
    _check_contiguous("x", x)
    if x.shape[1] == 0:
        raise ValueError(f"x must have at least one column, got shape {tuple(x.shape)}")
    _check_tensor("token_topk_to_pos", token_topk_to_pos, (torch.int32,), 2, "(T, K)")
    _check_contiguous("token_topk_to_pos", token_topk_to_pos)
    _check_slots("token_topk_to_pos", token_topk_to_pos)
    if token_topk_to_pos.shape[0] != x.shape[0]:
        raise ValueError(f"token_topk_to_pos has {token_topk_to_pos.shape[0]} rows (tokens), x has {x.shape[0]}")
    num_rows = _check_int("num_expanded_rows", num_expanded_rows, 0, INT32_MAX)
    if x_sf is not None:
        _check_tensor("x_sf", x_sf, SF_DTYPES, 2, "(T, G)")
        if x_sf.shape[0] != x.shape[0]:
            raise ValueError(f"x_sf has {x_sf.shape[0]} rows, x has {x.shape[0]} (one sf row per token)")
        if x_sf.shape[1] == 0:
            raise ValueError(f"x_sf must have at least one column, got shape {tuple(x_sf.shape)}")
        if not (x_sf.is_contiguous() or is_tma_column_major(x_sf)):
            raise ValueError(f"x_sf must be row-major contiguous or TMA-aligned column-major (stride(0) == 1, "
                             f"stride(1) == {tma_padded_rows(x_sf.shape[0], x_sf.dtype)}), got strides "
                             f"{x_sf.stride()} for shape {tuple(x_sf.shape)}")
    _check_same_device("x", x, token_topk_to_pos=token_topk_to_pos, x_sf=x_sf)
    return num_rows


def _scatter_rows(src: torch.Tensor, token_topk_to_pos: torch.Tensor, out: torch.Tensor) -> None:
    """out[pos] = src[t] for every pair (t, k) with 0 <= pos < len(out), as raw bits.

    Pairs without a row are sent to a spare row past the end, so that no
    boolean indexing (a device-to-host sync) is needed.
    """
    num_rows = out.shape[0]
    if src.shape[0] == 0 or num_rows == 0:
        return
    view = _BITS_VIEW[src.element_size()]
    pos = token_topk_to_pos.to(torch.int64)
    target = torch.where((pos >= 0) & (pos < num_rows), pos, num_rows).reshape(-1)
    source = torch.arange(src.shape[0], device=src.device).repeat_interleave(pos.shape[1])
    with_spare = torch.zeros((num_rows + 1, src.shape[1]), dtype=view, device=src.device)
    with_spare[target] = src.view(view)[source]
    out.view(view).copy_(with_spare[:num_rows])


def expand_to_fused(x: torch.Tensor, token_topk_to_pos: torch.Tensor, num_expanded_rows: int,
                    x_sf: torch.Tensor | None = None):
    """out (N, H): row pos = token_topk_to_pos[t, k] holds x[t], padding rows zero; bits unchanged.

    With x_sf (the per-token sf of a quantised x), returns (out, out_sf):
    out_sf (N, G) holds the sf rows moved the same way, in x_sf's dtype and
    layout (row-major, or TMA-aligned column-major padded for N).
    """
    num_rows = _check_expand_args(x, token_topk_to_pos, num_expanded_rows, x_sf)
    out = torch.zeros((num_rows, x.shape[1]), dtype=x.dtype, device=x.device)
    _scatter_rows(x, token_topk_to_pos, out)
    if x_sf is None:
        return out
    if is_tma_column_major(x_sf):
        out_sf = column_major_zeros(num_rows, x_sf.shape[1], x_sf.dtype, x_sf.device)
    else:
        out_sf = torch.zeros((num_rows, x_sf.shape[1]), dtype=x_sf.dtype, device=x_sf.device)
    moved_sf = torch.zeros((num_rows, x_sf.shape[1]), dtype=x_sf.dtype, device=x_sf.device)
    _scatter_rows(x_sf.contiguous(), token_topk_to_pos, moved_sf)
    out_sf.copy_(moved_sf)
    return out, out_sf


def _check_reduce_args(x: object, topk_weights: object, token_topk_to_pos: object, x_sf: object) -> None:
    _check_tensor("x", x, REDUCE_DTYPES, 2, "(N, H)")
    _check_contiguous("x", x)
    if x.shape[1] == 0:
        raise ValueError(f"x must have at least one column, got shape {tuple(x.shape)}")
    _check_tensor("topk_weights", topk_weights, (torch.float32,), 2, "(T, K)")
    _check_contiguous("topk_weights", topk_weights)
    _check_slots("topk_weights", topk_weights)
    _check_tensor("token_topk_to_pos", token_topk_to_pos, (torch.int32,), 2, "(T, K)")
    _check_contiguous("token_topk_to_pos", token_topk_to_pos)
    if token_topk_to_pos.shape != topk_weights.shape:
        raise ValueError(f"token_topk_to_pos has shape {tuple(token_topk_to_pos.shape)}, topk_weights "
                         f"{tuple(topk_weights.shape)}: they must match (T, K)")
    if x.dtype == torch.float8_e4m3fn:
        if x_sf is None:
            raise ValueError("x_sf is required with a float8_e4m3fn x (its per-row dequant scale)")
        _check_tensor("x_sf", x_sf, (torch.float32,), 2, "(N, 1)")
        if tuple(x_sf.shape) != (x.shape[0], 1):
            raise ValueError(f"x_sf must have shape (N, 1) = {(x.shape[0], 1)} (one sf per row of x), "
                             f"got {tuple(x_sf.shape)}")
        if x.shape[0] > 1 and x_sf.stride(0) != 1:
            raise ValueError(f"x_sf must have stride(0) == 1, got strides {x_sf.stride()}")
    elif x_sf is not None:
        raise ValueError(f"x_sf is only for a float8_e4m3fn x; x has dtype {x.dtype}")
    _check_same_device("x", x, topk_weights=topk_weights, token_topk_to_pos=token_topk_to_pos, x_sf=x_sf)


def reduce_fused(x: torch.Tensor, topk_weights: torch.Tensor, token_topk_to_pos: torch.Tensor,
                 x_sf: torch.Tensor | None = None) -> torch.Tensor:
    """out[t] = sum_k w[t, k] * x[pos(t, k)] over slots with 0 <= pos < N (see the module docstring).

    fp32: each term is one product (w * x; for e4m3, w * (q * sf), two),
    added to a +0 accumulator in slot order; a skipped slot leaves the
    accumulator alone.  One final rounding to the output dtype.
    """
    _check_reduce_args(x, topk_weights, token_topk_to_pos, x_sf)
    num_rows = x.shape[0]
    num_tokens, k = topk_weights.shape
    out_dtype = torch.float32 if x.dtype == torch.float32 else torch.bfloat16
    acc = torch.zeros((num_tokens, x.shape[1]), dtype=torch.float32, device=x.device)
    if num_rows > 0:
        rows = x.float()
        if x_sf is not None:
            rows = rows * x_sf.reshape(num_rows, 1)
        pos = token_topk_to_pos.to(torch.int64)
        for slot in range(k):
            valid = ((pos[:, slot] >= 0) & (pos[:, slot] < num_rows))[:, None]
            gathered = rows[torch.where(valid[:, 0], pos[:, slot], 0)]
            acc = torch.where(valid, acc + topk_weights[:, slot : slot + 1] * gathered, acc)
    return acc.to(out_dtype)


def _check_normalize_args(topk_weights: object) -> None:
    _check_tensor("topk_weights", topk_weights, (torch.float32,), 2, "(T, K)")
    _check_contiguous("topk_weights", topk_weights)
    _check_slots("topk_weights", topk_weights)


def normalize_weight(topk_weights: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(denom, topk_weights / denom): denom = sum_k w[t, k] in fp32 slot order, plus 1e-20 as fp32."""
    _check_normalize_args(topk_weights)
    denom = torch.zeros(topk_weights.shape[0], dtype=torch.float32, device=topk_weights.device)
    for slot in range(topk_weights.shape[1]):
        denom = denom + topk_weights[:, slot]
    denom = denom + NORMALIZE_EPS
    return denom, topk_weights / denom[:, None]
