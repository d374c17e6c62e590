"""Exact integer oracle of Engram's n-gram hash (docs/contract/engram.md#engram.hash).

Token t's n-gram of order n (2 <= n <= N, N = max_ngram_size) is its first n columns
ids[t, 0 .. n-1] (column i holds the token i positions back).  For layer l and table j of order n
(column c = (n - 2) K + j of the output, K tables an order):

    mix   = (ids[t, 0] * mult[l, 0]) xor ... xor (ids[t, n-1] * mult[l, n-1])
    index = (mix mod vocab[l, n-2, j]) + offsets[l, c]

and every index of an image token (image_token_mask[t] true) is -1.  The contract's domain keeps
every quantity non-negative and every product below 2^63, so the int64 products of an
implementation are exact, xor of non-negative int64 stays non-negative, and C's truncated `%`,
Python's floored `%` and TIR's floormod agree.  This oracle computes in Python integers (numpy
object arrays): exact, and it refuses arguments outside that domain rather than guess.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

INT32_MAX = 2**31 - 1
INT64_MAX = 2**63 - 1
IMAGE_INDEX = -1  # every index of an image token


def _ints(name: str, t: Any, ndim: int) -> np.ndarray:
    a = t.detach().cpu().numpy() if isinstance(t, torch.Tensor) else np.asarray(t)
    if a.ndim != ndim:
        raise ValueError(f"{name} must be {ndim}-D, got shape {a.shape}")
    if a.size and a.dtype.kind not in "iu":
        raise TypeError(f"{name} must hold integers, got {a.dtype}")
    return a.astype(object)


def hash_shapes(ngram_token_ids: Any, multipliers: Any, vocab_sizes: Any, offsets: Any) -> tuple[int, int, int, int]:
    """(T tokens, N max_ngram_size, L layers, K tables an order), after checking the shapes agree."""
    tokens, ngram = np.shape(ngram_token_ids)
    layers = np.shape(multipliers)[0]
    if ngram < 2:
        raise ValueError(f"ngram_token_ids must have max_ngram_size >= 2 columns, got {ngram}")
    if tuple(np.shape(multipliers)) != (layers, ngram):
        raise ValueError(f"multipliers must have shape (L, N) = {(layers, ngram)}, got {tuple(np.shape(multipliers))}")
    shape = tuple(np.shape(vocab_sizes))
    if len(shape) != 3 or shape[:2] != (layers, ngram - 1) or shape[2] < 1:
        raise ValueError(f"vocab_sizes must have shape (L, N - 1, K) = ({layers}, {ngram - 1}, K >= 1), got {shape}")
    per_ngram = shape[2]
    if tuple(np.shape(offsets)) != (layers, (ngram - 1) * per_ngram):
        raise ValueError(f"offsets must have shape (L, (N - 1) K) = {(layers, (ngram - 1) * per_ngram)}, "
                         f"got {tuple(np.shape(offsets))}")
    return tokens, ngram, layers, per_ngram


def engram_hash(ngram_token_ids: Any, multipliers: Any, vocab_sizes: Any, offsets: Any,
                image_token_mask: Any = None) -> torch.Tensor:
    """The embedding indices, int32 (L, T, (N - 1) K); see the module docstring."""
    ids = _ints("ngram_token_ids", ngram_token_ids, 2)
    mult = _ints("multipliers", multipliers, 2)
    vocab = _ints("vocab_sizes", vocab_sizes, 3)
    offs = _ints("offsets", offsets, 2)
    tokens, ngram, layers, per_ngram = hash_shapes(ids, mult, vocab, offs)
    if ids.size and (ids.min() < 0 or ids.max() > INT32_MAX):
        raise ValueError("ngram_token_ids must lie in [0, 2^31 - 1] (the contract's domain)")
    if mult.size and (mult.min() < 0 or mult.max() > INT64_MAX):
        raise ValueError("multipliers must lie in [0, 2^63 - 1] (the contract's domain)")
    if vocab.size and vocab.min() < 1:
        raise ValueError("vocab_sizes must be >= 1")
    flat_vocab = vocab.reshape(layers, (ngram - 1) * per_ngram)
    if offs.size and (offs.min() < 0 or (offs + flat_vocab - 1).max() > INT32_MAX):
        raise ValueError("offsets must be >= 0 with offset + vocab_size - 1 <= 2^31 - 1 (the contract's domain)")
    products = ids[None, :, :] * mult[:, None, :]  # (L, T, N), exact
    if products.size and products.max() > INT64_MAX:
        raise ValueError("a product ngram_token_ids * multipliers passes 2^63 - 1 (outside the contract's domain)")

    out = np.empty((layers, tokens, (ngram - 1) * per_ngram), dtype=np.int64)
    mix = products[:, :, 0]
    for n in range(2, ngram + 1):
        mix = mix ^ products[:, :, n - 1]  # the order-n mix, (L, T)
        for j in range(per_ngram):
            c = (n - 2) * per_ngram + j
            out[:, :, c] = (mix % flat_vocab[:, c][:, None] + offs[:, c][:, None]).astype(np.int64)
    if image_token_mask is not None:
        mask = image_token_mask.detach().cpu().numpy() if isinstance(image_token_mask, torch.Tensor) \
            else np.asarray(image_token_mask)
        if mask.shape != (tokens,):
            raise ValueError(f"image_token_mask must have shape (T,) = {(tokens,)}, got {mask.shape}")
        out[:, mask.astype(bool), :] = IMAGE_INDEX
    return torch.from_numpy(out.astype(np.int32))
