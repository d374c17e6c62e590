"""Strategies for Engram's n-gram hash: cases of ``engram_hash(ngram_token_ids, multipliers, vocab_sizes,
offsets, image_token_mask)`` (docs/contract/engram.md#engram.hash).

A case draws the sizes (L layers 1 .. 3, N = max_ngram_size 2 .. 4, K tables an order 1 .. 8; the
Engram defaults L 2, N 3, K 8 about half the time; T from 0, small tails and up to 257 tokens), then a
class for each input, each tagged with ``event("class: ...")``:

- token ids: random below a tokenizer's vocabulary (129280), at the boundaries (0 and the largest id
  of the case's range, 2^31 - 1 included), or a repeated pad id (runs of identical n-grams);
- multipliers: Engram's kind (odd, below 2^63 / (largest id + 1), so that no product passes 2^63 - 1),
  small ones (0 .. 8, zero included), or one (every product is the id itself);
- table sizes: primes near Engram's 646403, small sizes (1 .. 17: size 1 maps everything to index 0
  of its table), or sizes near 2^31 - 1 (the offsets then stay 0);
- offsets: the exclusive prefix sums of each layer's sizes (the layout of one embedding table holding
  them all), zeros, or random ones (within the int32 range with the table's size);
- the image-token mask: none set, all set, alternating, or random;
- modulus edges: for up to four (layer, order, table, token) the first multiplier of every layer is set
  to 1 and the token's first id chosen so that the order's mix is 0 or size - 1 modulo that table's
  size (the first or last row of the table).

Everything stays in the contract's domain: ids in [0, 2^31 - 1], multipliers >= 0 with every
product below 2^63, sizes >= 1, offset + size - 1 <= 2^31 - 1.
"""

from __future__ import annotations

import numpy as np
import torch
from hypothesis import event, strategies as st

from strategies import rarely, seeds, torch_copy
from strategies.classes import draws_rng
from tkverify.case import Case

TOKENIZER_VOCAB = 129280
INT32_MAX = 2**31 - 1
INT64_MAX = 2**63 - 1
ENGRAM_PRIME_BASE = 646403
TOKEN_COUNTS = (0, 1, 2, 3, 5, 7, 31, 33, 65, 127, 129)
LARGEST_TOKENS = 257
ID_CLASSES = ("random", "boundary", "pad")
MULTIPLIER_CLASSES = ("engram", "small", "one")
VOCAB_CLASSES = ("primes", "small", "huge")
OFFSET_CLASSES = ("prefix", "zero", "random")
MASK_CLASSES = ("none", "all", "alternating", "random")
EDGES = ("zero", "last")
SINGLE_TOKEN_SHARE = 1 / 4


def _is_prime(n: int) -> bool:
    if n < 2:
        return False
    f = 2
    while f * f <= n:
        if n % f == 0:
            return False
        f += 1
    return True


def _primes_from(start: int, count: int) -> list[int]:
    out, n = [], start
    while len(out) < count:
        n += 1
        if _is_prime(n):
            out.append(n)
    return out


def _vocab_sizes(rng, kind: str, layers: int, orders: int, per_ngram: int) -> np.ndarray:
    shape = (layers, orders, per_ngram)
    if kind == "primes":  # distinct primes above a base, like Engram's tables
        base = ENGRAM_PRIME_BASE + int(rng.integers(0, 10_000))
        return np.array(_primes_from(base, layers * orders * per_ngram), dtype=np.int64).reshape(shape)
    if kind == "small":
        return rng.integers(1, 17, size=shape, endpoint=True)
    return INT32_MAX - rng.integers(0, 1000, size=shape)  # huge: offsets stay 0


def _offsets(rng, kind: str, vocab: np.ndarray) -> np.ndarray:
    flat = vocab.reshape(vocab.shape[0], -1)
    room = INT32_MAX - (flat - 1)  # offset + size - 1 <= 2^31 - 1
    if kind == "prefix" and (flat.sum(1) <= INT32_MAX).all():
        return np.concatenate([np.zeros((flat.shape[0], 1), np.int64), np.cumsum(flat, 1)[:, :-1]], 1)
    if kind == "random":
        return (rng.random(flat.shape) * room).astype(np.int64)
    return np.zeros(flat.shape, np.int64)


def _mask(rng, kind: str, tokens: int) -> np.ndarray:
    if kind == "all":
        return np.ones(tokens, bool)
    if kind == "alternating":
        return np.arange(tokens) % 2 == 1
    if kind == "random":
        return rng.random(tokens) < 0.3
    return np.zeros(tokens, bool)


def _plant_edge(rng, ids: np.ndarray, mult: np.ndarray, vocab: np.ndarray, layer: int, order: int, table: int,
                token: int, edge: str) -> None:
    """ids[token, 0] chosen so that the order's mix is 0 or size - 1 modulo the table's size, the first
    multipliers being 1 (the caller sets them all, so the id's products stay below 2^31 in every layer):
    mix = ids[token, 0] xor rest, so ids[token, 0] = M xor rest for an M of the wanted residue that agrees
    with rest above bit 31 (then ids[token, 0] < 2^31)."""
    rest = 0
    for i in range(1, order):
        rest ^= int(ids[token, i]) * int(mult[layer, i])
    size = int(vocab[layer, order - 2, table])
    residue = 0 if edge == "zero" else size - 1
    high = rest & ~INT32_MAX
    low = (residue - high) % size
    low += size * int(rng.integers(0, (INT32_MAX - low) // size + 1))
    ids[token, 0] = (high + low) ^ rest


@st.composite
def engram_hash_cases(draw) -> Case:
    """Cases of ``engram_hash(ngram_token_ids, multipliers, vocab_sizes, offsets, image_token_mask)``."""
    if draw(st.booleans()):
        layers, ngram, per_ngram = 2, 3, 8
    else:
        layers, ngram, per_ngram = draw(st.integers(1, 3)), draw(st.integers(2, 4)), draw(st.integers(1, 8))
    tokens = draw(rarely(st.sampled_from(TOKEN_COUNTS), st.integers(0, LARGEST_TOKENS), one_in=8))
    classes = {"ids": draw(st.sampled_from(ID_CLASSES)), "multipliers": draw(st.sampled_from(MULTIPLIER_CLASSES)),
               "vocab": draw(st.sampled_from(VOCAB_CLASSES)), "offsets": draw(st.sampled_from(OFFSET_CLASSES)),
               "mask": draw(st.sampled_from(MASK_CLASSES))}
    edges = draw(st.lists(st.tuples(st.integers(0, layers - 1), st.integers(2, ngram), st.integers(0, per_ngram - 1),
                                    st.sampled_from(("first", "last", "random")), st.sampled_from(EDGES)),
                          max_size=4)) if tokens else []
    for name, kind in classes.items():
        event(f"class: {name} {kind}")
    if edges:
        event("class: modulus edges")
    seed = draw(seeds())
    # A single token in about SINGLE_TOKEN_SHARE of the cases, the case's draws deciding (`draws_rng`, so
    # that they stay as they are): the ci profile's examples seldom draw one.  Edges drawn for more tokens
    # go to it.
    if draws_rng((layers, ngram, per_ngram, tokens, classes, edges, seed), 1).random() < SINGLE_TOKEN_SHARE:
        tokens = 1
    rng = np.random.default_rng([seed])

    largest = INT32_MAX if classes["ids"] == "boundary" and rng.random() < 0.5 else TOKENIZER_VOCAB - 1
    if classes["ids"] == "random":
        ids = rng.integers(0, largest, size=(tokens, ngram), endpoint=True)
    elif classes["ids"] == "boundary":
        ids = np.where(rng.random((tokens, ngram)) < 0.5, 0, largest)
    else:
        ids = np.full((tokens, ngram), 2, np.int64)
        ids[rng.random((tokens, ngram)) < 0.2] = rng.integers(0, TOKENIZER_VOCAB)
    bound = INT64_MAX // max(largest, 1)  # every product ids * mult stays <= 2^63 - 1
    if classes["multipliers"] == "engram":
        mult = rng.integers(0, (bound - 1) // 2, size=(layers, ngram)) * 2 + 1
    elif classes["multipliers"] == "small":
        mult = rng.integers(0, 8, size=(layers, ngram), endpoint=True)
    else:
        mult = np.ones((layers, ngram), np.int64)
    vocab = _vocab_sizes(rng, classes["vocab"], layers, ngram - 1, per_ngram)
    offsets = _offsets(rng, classes["offsets"], vocab)
    mask = _mask(rng, classes["mask"], tokens)
    if edges:
        mult[:, 0] = 1
    for layer, order, table, where, edge in edges:
        token = {"first": 0, "last": tokens - 1}.get(where, int(rng.integers(0, tokens)))
        _plant_edge(rng, ids, mult, vocab, layer, order, table, token, edge)

    def int_tensor(a: np.ndarray, dtype: type) -> torch.Tensor:
        return torch_copy(np.ascontiguousarray(a, dtype=dtype))

    return Case(params={}, inputs={
        "ngram_token_ids": int_tensor(ids, np.int32),
        "multipliers": int_tensor(mult, np.int64),
        "vocab_sizes": int_tensor(vocab, np.int32),
        "offsets": int_tensor(offsets, np.int32),
        "image_token_mask": torch_copy(mask),
    })
