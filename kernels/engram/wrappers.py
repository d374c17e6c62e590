"""The Engram entry points over the TileLang kernels: argument checks, configuration, launches.

``engram_gate_fwd`` and ``engram_gate_bwd`` take and return what ``kernels/torch/engram.py``'s do,
and call its checks, so the same bad arguments raise the same errors; ``EngramGate`` is the autograd
Function over the two, ``engram_gate`` the call with unfused weights.  What the kernels add to the
eager checks: working precision only (float64 raises TypeError), every tensor on one CUDA device,
H a multiple of 8 with 8 <= H <= 7168, 1 <= hc <= 8, T hc within int32 (ValueError).  T = 0 returns
empty outputs (grad_w zeros) without a launch.

``fused_weight``, ``grad_w_reduce`` and ``engram_hash`` take and return what their eager namesakes
in ``kernels/torch/engram.py`` do (grad_w_reduce updates its accumulators in place and returns them),
after the same checks, and add: CUDA tensors; grad_w_reduce hc H a multiple of 4 (its float4
columns); every size within int32 (engram_hash: L T (N - 1) K too).  Nothing to compute launches
nothing.
"""

import functools
import math

import torch

from .. import _tilelang
from ..torch import engram as eager
from .configs import (CHUNK, MAX_HEADS, MAX_HIDDEN, backward_blocks, bwd_config, forward_tokens_per_block, fwd_config,
                      fwd_resident)
from .gate_bwd import GATE_BWD
from .gate_fwd import GATE_FWD
from .fused_weight import FUSED_VECTOR, FUSED_WEIGHT, FusedWeightConfig
from .grad_w_reduce import GRAD_W_REDUCE, ReduceConfig
from .hash import ENGRAM_HASH, HashConfig


def _check_working_precision(name: str, t: object) -> None:
    """The eager checks accept an all-float64 call; the kernels do not."""
    if isinstance(t, torch.Tensor) and t.dtype == torch.float64:
        raise TypeError(f"{name} must have dtype torch.bfloat16, got {t.dtype} "
                        "(the TileLang kernels run in working precision only)")


def _check_kernel_domain(named: tuple[tuple[str, torch.Tensor], ...], tokens: int, heads: int, hidden: int) -> None:
    """What the kernels add to the eager checks: CUDA, int32 sizes, H % 8 == 0, H and hc bounds."""
    for name, t in named:
        _tilelang.check_tensor(name, t)
        _tilelang.check_dims_fit_int32(name, t)
    if hidden % CHUNK != 0 or hidden > MAX_HIDDEN:
        raise ValueError(f"x: the TileLang kernels need H a multiple of {CHUNK} and at most {MAX_HIDDEN} "
                         f"(16-byte rows, one chunk a thread), got H = {hidden}")
    if heads > MAX_HEADS:
        raise ValueError(f"x: the TileLang kernels support hc <= {MAX_HEADS} heads, got hc = {heads}")
    if tokens * heads > _tilelang.MAX_DIM:
        raise ValueError(f"x: T * hc must be at most {_tilelang.MAX_DIM} (int32 row indices), got {tokens * heads}")


def _words(t: torch.Tensor) -> torch.Tensor:
    """A bf16 tensor as int32 words (two elements each), last axis halved."""
    return _tilelang.aligned(t).view(torch.int32)


def _row_constants(hidden: int) -> tuple[float, float]:
    """(s, 1 / H): the fp32 scale 1 / sqrt(H) and reciprocal of H (each rounded once, from float64)."""
    return 1.0 / math.sqrt(hidden), 1.0 / hidden


@functools.lru_cache(maxsize=None)
def _multiprocessors(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


def engram_gate_fwd(x: torch.Tensor, k: torch.Tensor, v: torch.Tensor, w: torch.Tensor,
                    eps: float = 1e-6, clamp: float = 1e-6):
    """(out bf16 (T, hc, H), d, g, rx, rk fp32 (T, hc)); see kernels/torch/engram.py."""
    _check_working_precision("x", x)
    _, eps, clamp = eager._check_inputs(x, k, v, w, eps, clamp)
    tokens, heads, hidden = x.shape
    _check_kernel_domain((("x", x), ("k", k), ("v", v), ("w", w)), tokens, heads, hidden)
    out = torch.empty_like(x)
    saved = [torch.empty((tokens, heads), dtype=torch.float32, device=x.device) for _ in range(4)]
    if tokens == 0:
        return (out, *saved)
    config = fwd_config(hidden)
    kernel = _tilelang.kernel_for(GATE_FWD, config, x.device)
    scale, inv_h = _row_constants(hidden)
    per_block = forward_tokens_per_block(tokens, heads, fwd_resident(config), _multiprocessors(x.device.index or 0),
                                         config.waves)
    num_blocks = -(-tokens // per_block) * heads
    with _tilelang.device_guard(x.device):
        kernel(_words(x), _words(k), _words(v), _tilelang.aligned(w).view(-1), out, *saved, eps, clamp, scale,
               inv_h, per_block, num_blocks)
    return (out, *saved)


def engram_gate_bwd(grad_out: torch.Tensor, x: torch.Tensor, k: torch.Tensor, v: torch.Tensor, w: torch.Tensor,
                    d: torch.Tensor, g: torch.Tensor, rx: torch.Tensor, rk: torch.Tensor,
                    eps: float = 1e-6, clamp: float = 1e-6):
    """(grad_x, grad_k bf16 (T, hc, H), grad_v bf16 (T, H), grad_w fp32 (hc, H)); see kernels/torch/engram.py.

    grad_w is deterministic: per-block fp32 partial sums reduced in a fixed order."""
    _check_working_precision("x", x)
    (act, acc), _, clamp = eager._check_inputs(x, k, v, w, eps, clamp)
    tokens, heads, hidden = x.shape
    eager._check_tensor("grad_out", grad_out, act, (tokens, heads, hidden), x.device, "(T, hc, H)")
    for name, saved in (("d", d), ("g", g), ("rx", rx), ("rk", rk)):
        eager._check_tensor(name, saved, acc, (tokens, heads), x.device, "(T, hc)")
    # x first: the eager checks put every tensor on x's device, so x names a wrong one.
    _check_kernel_domain((("x", x), ("grad_out", grad_out), ("k", k), ("v", v), ("w", w), ("d", d), ("g", g),
                          ("rx", rx), ("rk", rk)), tokens, heads, hidden)
    grad_x = torch.empty_like(x)
    grad_k = torch.empty_like(k)
    grad_v = torch.empty_like(v)
    if tokens == 0:
        return grad_x, grad_k, grad_v, torch.zeros((heads, hidden), dtype=torch.float32, device=x.device)
    grad_w = torch.empty((heads, hidden), dtype=torch.float32, device=x.device)
    config = bwd_config(hidden, heads)
    target = _tilelang.target_for(x.device)
    kernel = _tilelang.compiled_kernel(GATE_BWD, config, target)
    reduce = _tilelang.compiled_kernel(GRAD_W_REDUCE, ReduceConfig(), target)
    scale, inv_h = _row_constants(hidden)
    per_block, num_blocks = backward_blocks(tokens)
    partials = torch.empty((num_blocks, heads, hidden), dtype=torch.float32, device=x.device)
    flat = [_words(t).view(-1) for t in (grad_out, x, k, v)]
    flat += [_tilelang.aligned(t).view(-1) for t in (w, d, g, rx, rk)]
    with _tilelang.device_guard(x.device):
        kernel(*flat, grad_x.view(-1), grad_k.view(-1), grad_v.view(-1), partials.view(-1), tokens, heads,
               hidden // CHUNK, clamp, scale, inv_h, per_block, num_blocks)
        reduce(partials.view(num_blocks, heads * hidden), grad_w.view(heads * hidden))
    return grad_x, grad_k, grad_v, grad_w


# out = EngramGate.apply(x, k, v, w, eps, clamp) over the TileLang kernels, differentiable in x, k, v and w.
EngramGate = eager.gate_function(engram_gate_fwd, engram_gate_bwd)


def engram_gate(x: torch.Tensor, k: torch.Tensor, v: torch.Tensor, wh: torch.Tensor, we: torch.Tensor,
                eps: float = 1e-6, clamp: float = 1e-6) -> torch.Tensor:
    """Engram gating with the unfused weights: w = wh * we (fp32), through `EngramGate`."""
    return eager.apply_unfused(EngramGate, x, k, v, wh, we, eps, clamp)


# -- fused_weight, grad_w_reduce, engram_hash ------------------------------------------------------


def _check_cuda(named: tuple[tuple[str, torch.Tensor], ...]) -> None:
    for name, t in named:
        _tilelang.require_cuda(name, t)
        _tilelang.check_dims_fit_int32(name, t)


def fused_weight(weight_hidden: torch.Tensor, weight_embed: torch.Tensor) -> torch.Tensor:
    """weight_hidden * weight_embed, fp32 (hc, H), one IEEE product an element; see kernels/torch/engram.py."""
    eager._check_fused_weight(weight_hidden, weight_embed)
    _check_cuda((("weight_hidden", weight_hidden), ("weight_embed", weight_embed)))
    out = torch.empty(weight_hidden.shape, dtype=torch.float32, device=weight_hidden.device)
    n = weight_hidden.numel()
    if n > _tilelang.MAX_DIM:
        raise ValueError(f"weight_hidden: hc * H must be at most {_tilelang.MAX_DIM} (int32 indices), got {n}")
    tensors = (_tilelang.aligned(weight_hidden).view(-1), _tilelang.aligned(weight_embed).view(-1), out.view(-1))
    vectorized = n % FUSED_VECTOR == 0
    kernel = _tilelang.kernel_for(FUSED_WEIGHT, FusedWeightConfig(vectorized), weight_hidden.device)
    with _tilelang.device_guard(weight_hidden.device):
        kernel(*tensors)
    return out


def grad_w_reduce(grad_w_partial: torch.Tensor, weight_hidden: torch.Tensor, weight_embed: torch.Tensor,
                  grad_weight_hidden: torch.Tensor, grad_weight_embed: torch.Tensor):
    """(grad_weight_hidden, grad_weight_embed), updated in place: += S * weight_embed and += S * weight_hidden,
    S = sum_b grad_w_partial[b] in the fixed order of kernels/engram/grad_w_reduce.py; see
    kernels/torch/engram.py."""
    parts = eager._check_grad_w_reduce(grad_w_partial, weight_hidden, weight_embed, grad_weight_hidden,
                                      grad_weight_embed)
    # weight_hidden first: the eager checks put every tensor on its device, so it names a wrong one.
    _check_cuda((("weight_hidden", weight_hidden), ("grad_w_partial", grad_w_partial),
                 ("weight_embed", weight_embed), ("grad_weight_hidden", grad_weight_hidden),
                 ("grad_weight_embed", grad_weight_embed)))
    n = weight_hidden.numel()
    if n % 4 != 0 or n > _tilelang.MAX_DIM:
        raise ValueError(f"weight_hidden: the TileLang kernel needs hc * H a multiple of 4 (float4 columns) and at "
                         f"most {_tilelang.MAX_DIM}, got {n}")
    if parts == 0:
        return grad_weight_hidden, grad_weight_embed  # S = 0: every accumulator keeps its value
    # The partials are read as float4 (16-byte aligned start); the weights and accumulators element by element.
    kernel = _tilelang.kernel_for(GRAD_W_REDUCE, ReduceConfig(fused=True), weight_hidden.device)
    with _tilelang.device_guard(weight_hidden.device):
        kernel(_tilelang.aligned(grad_w_partial).view(parts, n), weight_hidden.view(-1), weight_embed.view(-1),
               grad_weight_hidden.view(-1), grad_weight_embed.view(-1))
    return grad_weight_hidden, grad_weight_embed


def engram_hash(ngram_token_ids: torch.Tensor, multipliers: torch.Tensor, vocab_sizes: torch.Tensor,
                offsets: torch.Tensor, image_token_mask: torch.Tensor | None = None) -> torch.Tensor:
    """Embedding indices, int32 (L, T, (N - 1) K); see kernels/torch/engram.py."""
    tokens, ngram, layers, per_ngram = eager._check_hash(ngram_token_ids, multipliers, vocab_sizes, offsets,
                                                        image_token_mask)
    named = (("ngram_token_ids", ngram_token_ids), ("multipliers", multipliers), ("vocab_sizes", vocab_sizes),
             ("offsets", offsets))
    _check_cuda(named + ((("image_token_mask", image_token_mask),) if image_token_mask is not None else ()))
    tables = (ngram - 1) * per_ngram
    out = torch.empty((layers, tokens, tables), dtype=torch.int32, device=ngram_token_ids.device)
    if out.numel() > _tilelang.MAX_DIM:
        raise ValueError(f"ngram_token_ids: L * T * (N - 1) * K must be at most {_tilelang.MAX_DIM} (int32 "
                         f"indices), got {out.numel()}")
    if out.numel() == 0:
        return out
    device = ngram_token_ids.device
    if image_token_mask is None:
        mask, has_mask = _tilelang.placeholder(torch.uint8, device), 0
    else:
        mask, has_mask = image_token_mask.view(torch.uint8), 1
    kernel = _tilelang.kernel_for(ENGRAM_HASH, HashConfig(), device)
    with _tilelang.device_guard(device):
        kernel(ngram_token_ids, multipliers, vocab_sizes.view(layers, tables), offsets, mask, out.view(-1),
               per_ngram, has_mask)
    return out
