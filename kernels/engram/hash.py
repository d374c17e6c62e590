"""The n-gram hash (engram.hash): embedding indices from token ids, one thread an index.

Contract: ``docs/contract/engram.md#engram.hash``.  For output element (l, t, c), c = (n - 2) K + j:

    mix   = (ids[t, 0] * mult[l, 0]) xor ... xor (ids[t, n - 1] * mult[l, n - 1])    int64
    index = (mix % vocab[l, c]) + offsets[l, c]                                       int32

and -1 where the token is an image token.  The products are int64 (the id widened first), `%` is
C's truncated remainder: in the contract's domain (ids, multipliers >= 0, every product below 2^63)
mix is non-negative, where it equals the floored residue the contract states.

Layout: the output (L, T, C) is one flat run; thread e takes element e, so a warp stores 32
consecutive int32 (128 contiguous bytes); the ids of a token and the per-layer rows of multipliers,
sizes and offsets are re-read from L1/L2 (they are C and L times smaller than the output).  T, N, L,
K are run-time sizes; one static configuration.
"""

# No `from __future__ import annotations` here: tilelang evaluates the
# prim_func parameter annotations, which name the builders' local symbolic sizes.

from typing import NamedTuple

from .. import _tilelang
from .._tilelang import KernelDef
from .configs import PASS_CONFIGS

HASH_THREADS = 256
IMAGE_INDEX = -1  # every index of an image token


class HashConfig(NamedTuple):
    pass


HASH_CONFIGS = (HashConfig(),)


def build_engram_hash(config: HashConfig):
    """prim_func(ids int32 (T, N), mult int64 (L, N), vocab int32 (L, C), offsets int32 (L, C),
    mask uint8 (M,), out int32 (L T C,), per_ngram K, has_mask): C = (N - 1) K; the mask (M = T) is
    read only where has_mask is nonzero."""
    T = _tilelang.T()
    tokens, ngram, layers, tables, mask_len, total = T.dynamic("tokens, ngram, layers, tables, mask_len, total")

    @T.prim_func
    def engram_hash(
        ids: T.Tensor((tokens, ngram), "int32"),
        mult: T.Tensor((layers, ngram), "int64"),
        vocab: T.Tensor((layers, tables), "int32"),
        offsets: T.Tensor((layers, tables), "int32"),
        mask: T.Tensor((mask_len,), "uint8"),
        out: T.Tensor((total,), "int32"),
        per_ngram: T.int32,
        has_mask: T.int32,
    ):
        T.annotate_pass_configs(PASS_CONFIGS)
        with T.Kernel(T.ceildiv(total, HASH_THREADS), threads=HASH_THREADS) as block:
            tx = T.get_thread_binding()
            e = T.alloc_var("int32", init=block * HASH_THREADS + tx)
            if e < total:
                # every operand is non-negative (and the launch has T > 0): C's truncated division
                layer = T.alloc_var("int32", init=T.truncdiv(e, tokens * tables))
                token = T.alloc_var("int32", init=T.truncdiv(T.truncmod(e, tokens * tables), tables))
                c = T.alloc_var("int32", init=T.truncmod(e, tables))
                order = T.alloc_var("int32", init=T.truncdiv(c, per_ngram) + 2)
                mix = T.alloc_var("int64", init=T.Cast("int64", ids[token, 0]) * mult[layer, 0])
                for i in T.serial(order - 1):
                    mix = T.bitwise_xor(mix, T.Cast("int64", ids[token, i + 1]) * mult[layer, i + 1])
                index = T.alloc_var("int32", init=T.Cast("int32", T.truncmod(mix, T.Cast("int64", vocab[layer, c])))
                                    + offsets[layer, c])
                if has_mask != 0:
                    if mask[token] != T.uint8(0):
                        index = IMAGE_INDEX
                out[e] = index

    return engram_hash


ENGRAM_HASH = KernelDef("engram.hash", build_engram_hash, HASH_CONFIGS)
