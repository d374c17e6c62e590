"""Engram's fused_weight, grad_w_reduce and n-gram hash on the CPU: the oracles by hand, the eager
implementations against them through the specs, their argument checks, the specs' bounds against wrong
implementations, the strategies' promised classes, and the tile_kernels mapping of the image mask."""

from __future__ import annotations

import dataclasses
import types

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, Phase, given, settings

import references.engram as ref
import references.engram_hash as ref_hash
from kernels.torch import engram as impl
from strategies import engram as strat
from strategies import engram_hash as strat_hash
from tkverify import registry
from tkverify.adapters import tile_kernels_engram_ops as adapter
from tkverify.case import Case
from tkverify.check import VerificationError, check_case
from tkverify.registry import Unsupported, torch_impl

BF16 = torch.bfloat16
FUSED, REDUCE, HASH = (registry.get(f"engram.{op}") for op in ("fused_weight", "grad_w_reduce", "hash"))
fuzz = settings(max_examples=40, deadline=None, derandomize=True, database=None,
                suppress_health_check=list(HealthCheck))


def bf16(values) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.float64).to(BF16)


def hand_hash_inputs() -> dict[str, torch.Tensor]:
    """L 2, N 3, K 2, T 3; worked below."""
    return {"ngram_token_ids": torch.tensor([[1, 2, 3], [4, 5, 6], [0, 0, 0]], dtype=torch.int32),
            "multipliers": torch.tensor([[3, 5, 7], [1, 1, 1]], dtype=torch.int64),
            "vocab_sizes": torch.tensor([[[7, 11], [13, 17]], [[5, 3], [2, 19]]], dtype=torch.int32),
            "offsets": torch.tensor([[0, 7, 18, 31], [0, 5, 8, 10]], dtype=torch.int32),
            "image_token_mask": torch.tensor([False, True, False])}


# -- the oracles, by hand -------------------------------------------------------------------


def test_hash_by_hand():
    # Token 0, layer 0: products 3, 10, 21; 2-gram mix 3 ^ 10 = 9: 9 % 7 + 0 = 2, 9 % 11 + 7 = 16;
    # 3-gram mix 9 ^ 21 = 28: 28 % 13 + 18 = 20, 28 % 17 + 31 = 42.  Layer 1: products 1, 2, 3;
    # mixes 3 and 0: 3 % 5 = 3, 3 % 3 + 5 = 5, 0 + 8, 0 + 10.  Token 1 is an image token: -1.
    # Token 2 (all ids 0): every mix is 0, so each index is its table's offset.
    expected = torch.tensor([[[2, 16, 20, 42], [-1, -1, -1, -1], [0, 7, 18, 31]],
                             [[3, 5, 8, 10], [-1, -1, -1, -1], [0, 5, 8, 10]]], dtype=torch.int32)
    out = ref_hash.engram_hash(**hand_hash_inputs())
    assert out.dtype == torch.int32 and torch.equal(out, expected)


def test_hash_image_token_by_hand_without_mask():
    # Token 1 = (4, 5, 6), layer 0: products 12, 25, 42; 12 ^ 25 = 21: 21 % 7 = 0, 21 % 11 + 7 = 17;
    # 21 ^ 42 = 63: 63 % 13 + 18 = 29, 63 % 17 + 31 = 43.  Layer 1: 4 ^ 5 = 1: 1, 1 + 5; 1 ^ 6 = 7:
    # 7 % 2 + 8 = 9, 7 % 19 + 10 = 17.
    out = ref_hash.engram_hash(**{**hand_hash_inputs(), "image_token_mask": None})
    assert out[:, 1].tolist() == [[0, 17, 29, 43], [1, 6, 9, 17]]


@pytest.mark.parametrize("change, message", [
    ({"ngram_token_ids": torch.tensor([[-1, 0, 0]] * 3, dtype=torch.int32)}, "ngram_token_ids"),
    ({"multipliers": torch.tensor([[2**62, 5, 7], [1, 1, 1]])}, "passes 2\\^63"),
    ({"vocab_sizes": torch.zeros(2, 2, 2, dtype=torch.int32)}, "vocab_sizes"),
    ({"offsets": torch.full((2, 4), 2**31 - 2, dtype=torch.int32)}, "offsets"),
])
def test_hash_oracle_refuses_arguments_outside_the_domain(change, message):
    with pytest.raises(ValueError, match=message):
        ref_hash.engram_hash(**{**hand_hash_inputs(), **change})


def test_fused_weight_by_hand():
    wh = bf16([[1.5, 2.0**-75, 1.5 * 2.0**-75, 2.0**64, float("inf"), -0.0]])
    we = bf16([[2.5, 2.0**-75, 2.0**-75, 2.0**64, 0.0, 3.0]])
    exact = ref.fused_weight(wh, we)
    assert exact[0, :4].tolist() == [3.75, 2.0**-150, 1.5 * 2.0**-150, 2.0**128]
    assert torch.isnan(exact[0, 4]) and exact[0, 5].item() == 0.0 and torch.signbit(exact[0, 5])
    # Rounded once to fp32: the tie 2^-150 goes to 0 (even), 1.5 2^-150 up to 2^-149, 2^128 overflows.
    out = impl.fused_weight(wh, we)
    assert out.dtype == torch.float32
    assert out[0, [0, 1, 2]].tolist() == [3.75, 0.0, 2.0**-149] and out[0, 3].item() == float("inf")
    assert FUSED.outputs["weight_fused"].compare("weight_fused", out, exact.numpy()).passed


def test_grad_w_reduce_by_hand():
    partial = torch.tensor([[[1.0, 2.0]], [[3.0, -2.0]]])  # S = (4, 0)
    wh, we = bf16([[2.0, 3.0]]), bf16([[0.5, 1.0]])
    acc_h, acc_e = torch.tensor([[1.0, 1.0]]), torch.tensor([[0.0, -5.0]])
    new_h, new_e = ref.grad_w_reduce(partial, wh, we, acc_h, acc_e)
    assert new_h.tolist() == [[3.0, 1.0]] and new_e.tolist() == [[8.0, -5.0]]
    out_h, out_e = impl.grad_w_reduce(partial, wh, we, acc_h, acc_e)
    assert out_h is acc_h and out_e is acc_e  # in place
    assert acc_h.tolist() == [[3.0, 1.0]] and acc_e.tolist() == [[8.0, -5.0]]


def test_grad_w_reduce_of_no_partials_leaves_the_accumulators():
    wh = we = bf16([[1.0, 2.0]])
    acc_h, acc_e = torch.tensor([[1.0, -2.0]]), torch.tensor([[3.0, 4.0]])
    new_h, new_e = ref.grad_w_reduce(torch.empty(0, 1, 2), wh, we, acc_h, acc_e)
    assert new_h.tolist() == [[1.0, -2.0]] and new_e.tolist() == [[3.0, 4.0]]
    impl.grad_w_reduce(torch.empty(0, 1, 2), wh, we, acc_h, acc_e)
    assert acc_h.tolist() == [[1.0, -2.0]] and acc_e.tolist() == [[3.0, 4.0]]


def test_grad_w_reduce_is_the_fused_weight_gradient_accumulated():
    """S is grad_w of w = wh * we: the results are the accumulators plus fused_weight_grads(S, wh, we)."""
    rng = np.random.default_rng(3)
    partial = torch.from_numpy(rng.standard_normal((5, 2, 8)).astype(np.float32))
    wh, we = bf16(rng.standard_normal((2, 8))), bf16(rng.standard_normal((2, 8)))
    acc = torch.from_numpy(rng.standard_normal((2, 8)).astype(np.float32))
    new_h, new_e = ref.grad_w_reduce(partial, wh, we, acc, acc)
    grad_wh, grad_we = ref.fused_weight_grads(partial.double().sum(0), wh, we)
    torch.testing.assert_close(new_h, acc.double() + grad_wh, rtol=1e-15, atol=0)
    torch.testing.assert_close(new_e, acc.double() + grad_we, rtol=1e-15, atol=0)


# -- the eager implementations against the oracles, through the specs ---------------------------


@fuzz
@given(case=strat.fused_weight_cases())
def test_torch_fused_weight_passes_its_spec(case):
    check_case(FUSED, FUSED.impls["torch"], case, case_dir=None)


@fuzz
@given(case=strat.grad_w_reduce_cases())
def test_torch_grad_w_reduce_passes_its_spec(case):
    check_case(REDUCE, REDUCE.impls["torch"], case, case_dir=None)


@fuzz
@given(case=strat_hash.engram_hash_cases())
def test_torch_hash_passes_its_spec(case):
    check_case(HASH, HASH.impls["torch"], case, case_dir=None)


# -- the specs fail wrong implementations -------------------------------------------------------


def _fails(spec, fn, case) -> bool:
    try:
        check_case(spec, dataclasses.replace(torch_impl(fn), name="wrong"), case, case_dir=None, excuse=False)
    except VerificationError:
        return True
    return False


def test_fused_weight_spec_fails_a_bf16_product():
    wh, we = bf16([[1.0 + 2**-7, 3.0]]), bf16([[1.0 + 2**-7, 1.0 + 2**-6]])  # exact products need 16 bits
    case = Case({}, {"weight_hidden": wh, "weight_embed": we})
    assert _fails(FUSED, lambda weight_hidden, weight_embed: (weight_hidden * weight_embed).float(), case)


def test_grad_w_reduce_spec_fails_swapped_weights_and_a_bf16_sum():
    rng = np.random.default_rng(5)
    partial = torch.from_numpy(rng.standard_normal((9, 2, 12)).astype(np.float32))
    inputs = {"grad_w_partial": partial, "weight_hidden": bf16(rng.standard_normal((2, 12))),
              "weight_embed": bf16(rng.standard_normal((2, 12)) + 2), "grad_weight_hidden": torch.zeros(2, 12),
              "grad_weight_embed": torch.zeros(2, 12)}
    case = Case({}, inputs)

    def swapped(grad_w_partial, weight_hidden, weight_embed, grad_weight_hidden, grad_weight_embed):
        return impl.grad_w_reduce(grad_w_partial, weight_embed, weight_hidden, grad_weight_hidden, grad_weight_embed)

    def bf16_sum(grad_w_partial, weight_hidden, weight_embed, grad_weight_hidden, grad_weight_embed):
        return impl.grad_w_reduce(grad_w_partial.to(BF16).float(), weight_hidden, weight_embed, grad_weight_hidden,
                                  grad_weight_embed)

    assert _fails(REDUCE, swapped, case) and _fails(REDUCE, bf16_sum, case)
    assert not _fails(REDUCE, impl.grad_w_reduce, case)


def test_hash_spec_fails_a_lost_offset_and_an_ignored_mask():
    case = Case({}, hand_hash_inputs())

    def no_offset(offsets, **kwargs):
        return impl.engram_hash(offsets=torch.zeros_like(offsets), **kwargs)

    def no_mask(image_token_mask, **kwargs):
        return impl.engram_hash(image_token_mask=None, **kwargs)

    assert _fails(HASH, no_offset, case) and _fails(HASH, no_mask, case)


# -- argument checks ----------------------------------------------------------------------------


def _weights(shape=(2, 8)):
    return torch.ones(shape, dtype=BF16), torch.ones(shape, dtype=BF16)


@pytest.mark.parametrize("args, error, name", [
    ((torch.ones(2, 8), torch.ones(2, 8, dtype=BF16)), TypeError, "weight_hidden"),
    ((torch.ones(2, 8, dtype=BF16), torch.ones(2, 8)), TypeError, "weight_embed"),
    ((torch.ones(2, 8, dtype=BF16), torch.ones(2, 4, dtype=BF16)), ValueError, "weight_embed"),
    ((torch.ones(8, dtype=BF16), torch.ones(8, dtype=BF16)), ValueError, "weight_hidden"),
    ((torch.ones(8, 2, dtype=BF16).t(), torch.ones(2, 8, dtype=BF16)), ValueError, "weight_hidden"),
    (([[1.0]], torch.ones(1, 1, dtype=BF16)), TypeError, "weight_hidden"),
])
def test_fused_weight_refuses_bad_arguments(args, error, name):
    with pytest.raises(error, match=name):
        impl.fused_weight(*args)


def _reduce_args(**change):
    wh, we = _weights()
    args = {"grad_w_partial": torch.zeros(3, 2, 8), "weight_hidden": wh, "weight_embed": we,
            "grad_weight_hidden": torch.zeros(2, 8), "grad_weight_embed": torch.zeros(2, 8)}
    args.update(change)
    return args


@pytest.mark.parametrize("change, error, name", [
    ({"grad_w_partial": torch.zeros(3, 2, 8, dtype=torch.float64)}, TypeError, "grad_w_partial"),
    ({"grad_w_partial": torch.zeros(3, 2, 4)}, ValueError, "grad_w_partial"),
    ({"grad_w_partial": torch.zeros(2, 8)}, ValueError, "grad_w_partial"),
    ({"weight_embed": torch.ones(2, 8)}, TypeError, "weight_embed"),
    ({"grad_weight_hidden": torch.zeros(2, 8, dtype=BF16)}, TypeError, "grad_weight_hidden"),
    ({"grad_weight_embed": torch.zeros(8, 2).t()}, ValueError, "grad_weight_embed"),
    ({"grad_weight_embed": torch.zeros(2, 7)}, ValueError, "grad_weight_embed"),
])
def test_grad_w_reduce_refuses_bad_arguments(change, error, name):
    with pytest.raises(error, match=name):
        impl.grad_w_reduce(**_reduce_args(**change))


def test_grad_w_reduce_refuses_one_tensor_as_both_accumulators():
    acc = torch.zeros(2, 8)
    with pytest.raises(ValueError, match="distinct"):
        impl.grad_w_reduce(**_reduce_args(grad_weight_hidden=acc, grad_weight_embed=acc))


@pytest.mark.parametrize("change, error, name", [
    ({"ngram_token_ids": torch.zeros(3, 3, dtype=torch.int64)}, TypeError, "ngram_token_ids"),
    ({"ngram_token_ids": torch.zeros(3, 1, dtype=torch.int32)}, ValueError, "ngram_token_ids"),
    ({"multipliers": torch.ones(2, 3, dtype=torch.int32)}, TypeError, "multipliers"),
    ({"multipliers": torch.ones(2, 4, dtype=torch.int64)}, ValueError, "multipliers"),
    ({"vocab_sizes": torch.ones(2, 3, 2, dtype=torch.int32)}, ValueError, "vocab_sizes"),
    ({"vocab_sizes": torch.ones(2, 2, 2, dtype=torch.int64)}, TypeError, "vocab_sizes"),
    ({"offsets": torch.zeros(2, 3, dtype=torch.int32)}, ValueError, "offsets"),
    ({"image_token_mask": torch.zeros(3, dtype=torch.int32)}, TypeError, "image_token_mask"),
    ({"image_token_mask": torch.zeros(4, dtype=torch.bool)}, ValueError, "image_token_mask"),
])
def test_hash_refuses_bad_arguments(change, error, name):
    with pytest.raises(error, match=name):
        impl.engram_hash(**{**hand_hash_inputs(), **change})


def test_hash_of_no_tokens_is_empty():
    inputs = {**hand_hash_inputs(), "ngram_token_ids": torch.empty(0, 3, dtype=torch.int32),
              "image_token_mask": torch.empty(0, dtype=torch.bool)}
    for fn in (impl.engram_hash, ref_hash.engram_hash):
        out = fn(**inputs)
        assert out.shape == (2, 0, 4) and out.dtype == torch.int32


# -- the strategies -----------------------------------------------------------------------------


def test_planted_modulus_edges_land_on_the_first_and_last_row_of_their_table():
    rng = np.random.default_rng(0)
    ids = rng.integers(0, 129280, size=(4, 3))
    mult = rng.integers(0, 2**40, size=(2, 3)) * 2 + 1
    mult[:, 0] = 1
    vocab = np.array(strat_hash._primes_from(646403, 2 * 2 * 8)).reshape(2, 2, 8)
    for layer, order, table, token, edge in ((0, 2, 3, 0, "zero"), (1, 3, 7, 3, "last"), (1, 2, 0, 1, "last")):
        strat_hash._plant_edge(rng, ids, mult, vocab, layer, order, table, token, edge)
        out = ref_hash.engram_hash(torch.from_numpy(ids.astype(np.int32)), torch.from_numpy(mult),
                                   torch.from_numpy(vocab.astype(np.int32)), torch.zeros(2, 16, dtype=torch.int32))
        size = int(vocab[layer, order - 2, table])
        assert int(out[layer, token, (order - 2) * 8 + table]) == (0 if edge == "zero" else size - 1)
        assert 0 <= ids[token, 0] <= 2**31 - 1


def _classes_reached(strategy, max_examples: int) -> set[str]:
    reached: set[str] = set()

    @settings(max_examples=max_examples, derandomize=True, database=None, deadline=None, phases=[Phase.generate],
              suppress_health_check=list(HealthCheck))
    @given(case=strategy)
    def draw(case):
        for name, t in case.inputs.items():
            reached.add(f"{name} {tuple(t.shape)[:1] == (0,)}")
        reached.add(f"inputs {sorted(case.inputs)}")
        reached.update(_tags(case))

    draw()
    return reached


def _tags(case: Case) -> set[str]:
    i = case.inputs
    tags = set()
    if "image_token_mask" in i:
        mask = i["image_token_mask"]
        tags.add("mask none" if not mask.any() else "mask all" if mask.all() else "mask some")
        tags.add("no tokens" if mask.numel() == 0 else "tokens")
        vocab = i["vocab_sizes"]
        if vocab.numel():
            tags.add("table size 1" if (vocab == 1).any() else "tables")
            tags.add("huge tables" if (vocab.long() > 2**30).any() else "small tables")
        ids = i["ngram_token_ids"]
        if ids.numel() and (ids == 2**31 - 1).any():
            tags.add("largest id")
    if set(i) == {"weight_hidden", "weight_embed"}:
        wh, we = (i[n].double() for n in ("weight_hidden", "weight_embed"))
        exact = wh * we
        tags.add("NaN product" if torch.isnan(exact).any() else "no NaN")
        tags.add("inf product" if torch.isinf(exact).any() else "finite")
        tags.add("fp32 subnormal product" if ((exact.abs() < 2.0**-126) & (exact != 0)).any() else "normal")
        tags.add("fp32 overflow" if (torch.isfinite(exact) & (exact.abs() >= 2.0**128)).any() else "in range")
    if "grad_w_partial" in i:
        p = i["grad_w_partial"]
        tags.add("P 0" if p.shape[0] == 0 else "P > 128" if p.shape[0] > 128 else "P some")
        assert torch.isfinite(p).all() and (p.double().abs().sum(0) <= strat.MAX_PARTIAL_SUM).all()
        for name in ("weight_hidden", "weight_embed", "grad_weight_hidden", "grad_weight_embed"):
            assert torch.isfinite(i[name]).all(), name
    return tags


def test_fused_weight_strategy_reaches_every_class():
    reached = _classes_reached(strat.fused_weight_cases(), 150)
    assert {"NaN product", "inf product", "fp32 subnormal product", "fp32 overflow"} <= reached, sorted(reached)


def test_grad_w_reduce_strategy_reaches_every_class_and_stays_in_its_domain():
    reached = _classes_reached(strat.grad_w_reduce_cases(), 150)
    assert {"P 0", "P some", "P > 128"} <= reached, sorted(reached)


def test_hash_strategy_reaches_every_class():
    reached = _classes_reached(strat_hash.engram_hash_cases(), 150)
    promised = {"mask none", "mask all", "mask some", "no tokens", "table size 1", "huge tables", "largest id"}
    assert promised <= reached, sorted(promised - reached)


# -- the tile_kernels mapping of the image mask -------------------------------------------------


def test_tile_kernels_1_0_refuses_image_tokens_and_drops_an_empty_mask(monkeypatch):
    calls = []
    fake = types.SimpleNamespace(engram_hash=lambda *args: calls.append(args) or "indices")
    monkeypatch.setattr(adapter, "_gen", lambda: 1)
    monkeypatch.setattr(adapter, "_tk", lambda submodule: fake)
    monkeypatch.setattr(adapter, "_v", lambda: "tile-kernels 1.0.0")
    inputs = hand_hash_inputs()
    with pytest.raises(Unsupported, match="image_token_mask"):
        adapter.engram_hash(**inputs)
    assert adapter.engram_hash(**{**inputs, "image_token_mask": torch.zeros(3, dtype=torch.bool)}) == "indices"
    assert len(calls[0]) == 4  # no mask argument for 1.0
    monkeypatch.setattr(adapter, "_gen", lambda: 2)
    adapter.engram_hash(**inputs)
    assert calls[1][4] is inputs["image_token_mask"]
