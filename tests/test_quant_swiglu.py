"""The plain SwiGLU and its backward with a per-token cast on the CPU: the oracles by hand, the hand
backward against torch.autograd and gradcheck in float64, the eager implementations against the
oracles through the specs, the specs' bounds against wrong implementations, argument checks, and the
tile_kernels mappings' refusals."""

from __future__ import annotations

import math
import types

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings

import references.quant_swiglu as ref
from kernels.torch import quant_swiglu as impl
from tkverify import registry
from tkverify.adapters import tile_kernels_quant_swiglu as adapter
from tkverify.case import Case
from tkverify.check import VerificationError, check_case
from tkverify.registry import Unsupported, torch_impl

SWIGLU, BWD_CAST = registry.get("quant.swiglu"), registry.get("quant.swiglu_backward_and_per_token_cast")
fuzz = settings(max_examples=60, deadline=None, derandomize=True, database=None,
                suppress_health_check=list(HealthCheck))
LN3 = math.log(3.0)  # sigmoid(ln 3) = 3/4


def f32(rows) -> torch.Tensor:
    return torch.tensor(rows, dtype=torch.float32)


# -- the oracles, by hand -------------------------------------------------------------------------


def test_forward_by_hand():
    # Row 0: l = ln 3, s = 3/4, r = 2: y = 1.5 ln 3.  Row 1: l = 0 gives 0 whatever r.
    x = torch.tensor([[LN3, 2.0], [0.0, 5.0]], dtype=torch.float64)
    assert ref.swiglu(x).tolist() == [[pytest.approx(1.5 * LN3, rel=1e-15)], [0.0]]


def test_backward_by_hand():
    # l = ln 3, r = 2, g = 1: dl = r s (1 + l (1 - s)) = 2 * 3/4 * (1 + ln3 / 4); dr = l s = 3/4 ln 3.
    x = torch.tensor([[LN3, 2.0]], dtype=torch.float64)
    grad = ref.swiglu_bwd(torch.ones(1, 1, dtype=torch.float64), x)
    assert grad[0, 0].item() == pytest.approx(1.5 * (1 + LN3 / 4), rel=1e-15)
    assert grad[0, 1].item() == pytest.approx(0.75 * LN3, rel=1e-15)


def test_clamp_by_hand():
    # c = 1: l = 2 clamps to 1 (dl = 0), r = -5 clamps to -1 (dr = 0): y = silu(1) * -1.
    # At the clamp exactly (l = 1, r = 1) the gradient passes.
    x = torch.tensor([[2.0, -5.0], [1.0, 1.0]], dtype=torch.float64)
    s1 = 1 / (1 + math.exp(-1))
    y = ref.swiglu(x, clamp=1.0)
    assert y[0, 0].item() == pytest.approx(-s1, rel=1e-15)
    grad = ref.swiglu_bwd(torch.ones(2, 1, dtype=torch.float64), x, clamp=1.0)
    assert grad[0].tolist() == [0.0, 0.0]
    assert grad[1, 0].item() == pytest.approx(s1 * (1 + (1 - s1)), rel=1e-15)
    assert grad[1, 1].item() == pytest.approx(s1, rel=1e-15)


def test_routing_by_hand():
    # Row 0 takes weight slot 3 (0.5), row 1 is padding: its NaN is never read.
    x = torch.tensor([[LN3, 2.0], [math.nan, 1.0]], dtype=torch.float64)
    w = torch.tensor([[1.0, 2.0], [4.0, 0.5]], dtype=torch.float32)
    pos = torch.tensor([3, -1], dtype=torch.int32)
    assert ref.swiglu(x, topk_weights=w, pos_to_token_topk=pos).tolist() == [[pytest.approx(0.75 * LN3)], [0.0]]
    grad = ref.swiglu_bwd(torch.ones(2, 1, dtype=torch.float64), x, topk_weights=w, pos_to_token_topk=pos)
    assert grad[1].tolist() == [0.0, 0.0] and grad[0, 1].item() == pytest.approx(0.375 * LN3)


def test_zero_cotangent_gives_zero_gradient_at_nan():
    x = torch.tensor([[math.nan, 1.0]], dtype=torch.float64)
    assert ref.swiglu_bwd(torch.zeros(1, 1, dtype=torch.float64), x).tolist() == [[0.0, 0.0]]
    assert torch.isnan(ref.swiglu_bwd(torch.ones(1, 1, dtype=torch.float64), x)).all()


def test_backward_cast_dequantises_x():
    # codes 2 and 1 with sf 0.5 and 2: l = 1, r = 2; the gradient's block amax sets the sf.
    x = torch.tensor([[2.0, 1.0]], dtype=torch.float32).to(torch.float8_e4m3fn)
    sf = torch.tensor([[0.5, 2.0]], dtype=torch.float32)
    x_grad, data, out_sf = ref.swiglu_backward_and_per_token_cast(x, sf, torch.ones(1, 1), "e4m3", 1)
    exact = ref.swiglu_bwd(torch.ones(1, 1, dtype=torch.float64), torch.tensor([[1.0, 2.0]], dtype=torch.float64))
    assert torch.equal(x_grad, exact.to(torch.bfloat16))
    assert out_sf[0].tolist() == pytest.approx([float(np.float32(abs(v) / 448)) for v in exact[0].tolist()])


# -- the hand backward against autograd and finite differences ---------------------------------------


@pytest.mark.parametrize("clamp", [None, 0.7])
def test_hand_backward_matches_autograd(clamp):
    gen = torch.Generator().manual_seed(1)
    x = (torch.randn(5, 12, generator=gen, dtype=torch.float64) * 3).requires_grad_()
    w = torch.rand(3, 2, generator=gen, dtype=torch.float64).float()
    pos = torch.tensor([0, 5, -1, 2, 1], dtype=torch.int32)
    g = torch.randn(5, 6, generator=gen, dtype=torch.float64)
    y = ref.swiglu_fwd_torch(x, topk_weights=w, pos_to_token_topk=pos, clamp=clamp)
    (auto,) = torch.autograd.grad(y, x, g)
    hand = ref.swiglu_bwd(g, x.detach(), topk_weights=w, pos_to_token_topk=pos, clamp=clamp)
    assert torch.allclose(hand, auto, rtol=1e-13, atol=1e-15)


def test_forward_oracles_agree():
    gen = torch.Generator().manual_seed(2)
    x = torch.randn(4, 16, generator=gen, dtype=torch.float64) * 4
    assert torch.allclose(ref.swiglu(x, clamp=2.0), ref.swiglu_fwd_torch(x, clamp=2.0), rtol=1e-15, atol=0)


def test_gradcheck_of_the_forward():
    gen = torch.Generator().manual_seed(3)
    x = (torch.randn(3, 8, generator=gen, dtype=torch.float64) * 2).requires_grad_()
    assert torch.autograd.gradcheck(lambda t: ref.swiglu_fwd_torch(t, clamp=10.0), (x,))


# -- the eager implementations against the oracles ------------------------------------------------------


@fuzz
@given(SWIGLU.strategy())
def test_torch_swiglu_against_oracle(case):
    assert all(c.passed for c in check_case(SWIGLU, SWIGLU.impls["torch"], case, case_dir=None))


@fuzz
@given(BWD_CAST.strategy())
def test_torch_backward_cast_against_oracle(case):
    assert all(c.passed for c in check_case(BWD_CAST, BWD_CAST.impls["torch"], case, case_dir=None))


def test_torch_backward_against_oracle_by_bracket():
    gen = torch.Generator().manual_seed(4)
    x = (torch.randn(6, 64, generator=gen) * 3).to(torch.bfloat16)
    g = torch.randn(6, 32, generator=gen).to(torch.bfloat16)
    case = Case(params={"fmt": "bf16", "clamp": 2.0}, inputs={"x": x})
    exact = {"grad_x": ref.swiglu_bwd(g, x, clamp=2.0)}
    bracket = SWIGLU.backward.given(case, {"out": g}, exact)["grad_x"]
    got = impl.swiglu_bwd(g, x, "bf16", clamp=2.0)
    assert SWIGLU.backward.grads["grad_x"].compare("grad_x", got, bracket).passed


# -- the bounds catch wrong implementations ---------------------------------------------------------


def _clamp_passing_gradient(grad_out, x, fmt="bf16", *, topk_weights=None, pos_to_token_topk=None, clamp=None):
    """Wrong: lets the gradient through the clamp."""
    return impl.swiglu_bwd(grad_out, x, fmt, topk_weights=topk_weights, pos_to_token_topk=pos_to_token_topk)


def test_bracket_rejects_a_gradient_through_the_clamp():
    x = torch.tensor([[3.0, 0.5, 1.0, -4.0]], dtype=torch.float32)
    g = torch.ones(1, 2)
    case = Case(params={"fmt": "fp32", "clamp": 1.0}, inputs={"x": x})
    bracket = SWIGLU.backward.given(case, {"out": g}, {"grad_x": ref.swiglu_bwd(g, x, clamp=1.0)})["grad_x"]
    policy = SWIGLU.backward.grads["grad_x"]
    assert policy.compare("grad_x", impl.swiglu_bwd(g, x, "fp32", clamp=1.0), bracket).passed
    assert not policy.compare("grad_x", _clamp_passing_gradient(g, x, "fp32", clamp=1.0), bracket).passed


def test_forward_bracket_rejects_a_missing_weight_and_a_wrong_dtype():
    x = torch.tensor([[1.0, 2.0], [0.5, -1.0]], dtype=torch.float32)
    w = torch.tensor([[0.25, 3.0]], dtype=torch.float32)
    pos = torch.tensor([1, 0], dtype=torch.int32)
    case = Case(params={"fmt": "fp32", "clamp": None}, inputs={"x": x, "topk_weights": w, "pos_to_token_topk": pos})
    with pytest.raises(VerificationError):
        check_case(SWIGLU, torch_impl(lambda x, fmt, **kw: impl.swiglu(x, fmt)), case, case_dir=None)
    with pytest.raises(VerificationError):
        check_case(SWIGLU, torch_impl(lambda **kw: impl.swiglu(**kw).to(torch.bfloat16)), case, case_dir=None)
    assert all(c.passed for c in check_case(SWIGLU, SWIGLU.impls["torch"], case, case_dir=None))


def test_cast_judge_rejects_a_cast_of_the_bf16_gradient_with_truncated_codes():
    gen = torch.Generator().manual_seed(5)
    x = (torch.randn(4, 64, generator=gen) * 50).to(torch.float8_e4m3fn)
    x_sf = torch.full((4, 2), 0.0625)
    g = torch.randn(4, 32, generator=gen).to(torch.bfloat16)
    case = Case(params={"fmt": "e4m3", "num_per_channels": 32, "clamp": None}, inputs={"x": x, "x_sf": x_sf,
                                                                                       "grad_out": g})

    def truncating(**kw):
        x_grad, data, sf = impl.swiglu_backward_and_per_token_cast(**kw)
        codes = data.view(torch.uint8)
        return x_grad, torch.where((codes & 0x7F) > 0, codes - 1, codes).view(torch.float8_e4m3fn), sf

    assert all(c.passed for c in check_case(BWD_CAST, BWD_CAST.impls["torch"], case, case_dir=None))
    with pytest.raises(VerificationError):
        check_case(BWD_CAST, torch_impl(truncating), case, case_dir=None)


# -- argument checks -------------------------------------------------------------------------------


@pytest.mark.parametrize("call, error, name", [
    (lambda: impl.swiglu(torch.ones(2, 3)), ValueError, "x"),
    (lambda: impl.swiglu(torch.ones(2, 4, dtype=torch.float64)), TypeError, "x"),
    (lambda: impl.swiglu(torch.ones(2, 4), "e4m3"), ValueError, "fmt"),
    (lambda: impl.swiglu(torch.ones(2, 4), clamp=-1.0), ValueError, "clamp"),
    (lambda: impl.swiglu(torch.ones(2, 4), clamp="1"), TypeError, "clamp"),
    (lambda: impl.swiglu(torch.ones(2, 4), topk_weights=torch.ones(1, 2)), ValueError, "topk_weights"),
    (lambda: impl.swiglu(torch.ones(2, 4), pos_to_token_topk=torch.tensor([0, -2], dtype=torch.int32)),
     ValueError, "pos_to_token_topk"),
    (lambda: impl.swiglu_bwd(torch.ones(2, 3), torch.ones(2, 4)), ValueError, "grad_out"),
    (lambda: impl.swiglu_bwd(torch.ones(2, 2, dtype=torch.int32), torch.ones(2, 4)), TypeError, "grad_out"),
    (lambda: impl.swiglu_backward_and_per_token_cast(torch.ones(2, 64), torch.ones(2, 2), torch.ones(2, 32),
                                                     "e4m3", 32), TypeError, "x"),
    (lambda: impl.swiglu_backward_and_per_token_cast(torch.ones(2, 64).to(torch.float8_e4m3fn), torch.ones(2, 3),
                                                     torch.ones(2, 32), "e4m3", 32), ValueError, "x_sf"),
    (lambda: impl.swiglu_backward_and_per_token_cast(torch.ones(2, 64).to(torch.float8_e4m3fn), torch.ones(2, 2),
                                                     torch.ones(2, 32), "e4m3", 48), ValueError, "num_per_channels"),
    (lambda: impl.swiglu_backward_and_per_token_cast(torch.ones(2, 64).to(torch.float8_e4m3fn), torch.ones(2, 2),
                                                     torch.ones(2, 32), "e4m3", 32, use_ue8m0=True),
     ValueError, "use_ue8m0"),
])
def test_bad_arguments_are_refused_by_name(call, error, name):
    with pytest.raises(error, match=name):
        call()


def test_only_the_eager_functions_read_the_index_range():
    """The metadata checks the TileLang wrappers share accept an index outside [-1, T*K) (reading it would
    synchronise with the device); the eager functions refuse it (the kernels treat it as a padding row:
    tests/test_bad_inputs.py's GPU tests)."""
    from kernels.torch import quant as q

    w = torch.ones(2, 2)
    pos = torch.tensor([0, 4, -2, 2**31 - 1], dtype=torch.int32)
    assert impl._check_swiglu_args(torch.ones(4, 8), "bf16", w, pos, None) == (4, None)
    for call in (lambda: impl.swiglu(torch.ones(4, 8), topk_weights=w, pos_to_token_topk=pos),
                 lambda: q.swiglu_forward_and_per_token_cast(torch.ones(4, 32), "e4m3", 16, topk_weights=w,
                                                             pos_to_token_topk=pos)):
        with pytest.raises(ValueError, match="^pos_to_token_topk values"):
            call()


def test_empty_batches():
    assert impl.swiglu(torch.ones(0, 8)).shape == (0, 4)
    assert impl.swiglu_bwd(torch.ones(0, 4), torch.ones(0, 8)).shape == (0, 8)
    x_grad, data, sf = impl.swiglu_backward_and_per_token_cast(
        torch.ones(0, 64).to(torch.float8_e4m3fn), torch.ones(0, 2), torch.ones(0, 32), "e4m3", 32)
    assert x_grad.shape == (0, 64) and data.shape == (0, 64) and sf.shape == (0, 2)


# -- the tile_kernels mappings' refusals -------------------------------------------------------------


def _fake_release(monkeypatch, gen: int, quant) -> None:
    monkeypatch.setattr(adapter, "_gen", lambda: gen)
    monkeypatch.setattr(adapter, "_tk", lambda submodule: quant)
    monkeypatch.setattr(adapter, "_v", lambda: f"tile-kernels {'1.0.0' if gen == 1 else '2.1.0'}")


def test_release_1_0_has_no_plain_swiglu(monkeypatch):
    _fake_release(monkeypatch, 1, types.SimpleNamespace())
    with pytest.raises(Unsupported, match="1.0.0"):
        adapter.swiglu(torch.ones(2, 4))
    with pytest.raises(Unsupported, match="1.0.0"):
        adapter.swiglu_bwd(torch.ones(2, 2), torch.ones(2, 4))


def test_release_2_1_gets_per_row_weights_zero_on_padding(monkeypatch):
    seen = {}

    def swiglu_forward(x, fmt, psum, topk_weights, scaling, clamp_value):
        seen.update(w=topk_weights, clamp=clamp_value)
        return "out"

    _fake_release(monkeypatch, 2, types.SimpleNamespace(swiglu_forward=swiglu_forward))
    w = torch.tensor([[1.0, 2.0], [4.0, 0.5]])
    pos = torch.tensor([3, -1, 0], dtype=torch.int32)
    assert adapter.swiglu(torch.ones(3, 4), "bf16", topk_weights=w, pos_to_token_topk=pos, clamp=7.0) == "out"
    assert seen["w"].tolist() == [0.5, 0.0, 1.0] and seen["clamp"] == 7.0
    with pytest.raises(Unsupported, match="padding"):
        adapter.swiglu(f32([[1, 2], [math.inf, 1]]), pos_to_token_topk=torch.tensor([0, -1], dtype=torch.int32))


def test_release_1_0_backward_cast_builds_the_inverse_routing(monkeypatch):
    seen = {}

    def swiglu_backward_and_per_token_cast(x, grad_out, weight, pos, inverse, npc, round_sf, clamp):
        seen.update(weight=weight, pos=pos, inverse=inverse)
        return None, ("data", torch.ones(2, 2)), "x_grad", None

    _fake_release(monkeypatch, 1, types.SimpleNamespace(
        swiglu_backward_and_per_token_cast=swiglu_backward_and_per_token_cast))
    x = torch.ones(2, 64).to(torch.float8_e4m3fn)
    args = (x, torch.ones(2, 2), torch.ones(2, 32, dtype=torch.bfloat16), "e4m3", 32)
    x_grad, data, _ = adapter.swiglu_backward_and_per_token_cast(*args)
    assert (x_grad, data) == ("x_grad", "data")
    assert seen["pos"].tolist() == [0, 1] and seen["inverse"].tolist() == [[0], [1]]
    adapter.swiglu_backward_and_per_token_cast(*args, pos_to_token_topk=torch.tensor([-1, 2], dtype=torch.int32),
                                               topk_weights=torch.ones(2, 2))
    assert seen["inverse"].tolist() == [[-1, -1], [1, -1]]
    with pytest.raises(Unsupported, match="bf16 cotangent"):
        adapter.swiglu_backward_and_per_token_cast(x, torch.ones(2, 2), torch.ones(2, 32), "e4m3", 32)


# -- swiglu_forward_and_per_channel_cast_and_transpose --------------------------------------------------

PER_CHANNEL = registry.get("quant.swiglu_forward_and_per_channel_cast_and_transpose")


def test_per_channel_oracle_by_hand():
    # One block of 2 tokens, H = 1: y = silu(ln 3) * r = 0.75 ln 3 * (2, -4); amax 3 ln 3, sf = amax / 448;
    # the quotients are 224 and -448 exactly, and the data comes back transposed, (1, 2).
    x = torch.tensor([[LN3, 2.0], [LN3, -4.0]], dtype=torch.float64)
    data, sf = ref.swiglu_forward_and_per_channel_cast_and_transpose(x, "e4m3", 16)
    assert sf.shape == (1, 1) and sf.item() == pytest.approx(3 * LN3 / 448, rel=1e-7)
    assert data.shape == (1, 2) and data.float().tolist() == [[224.0, -448.0]]
    plain, _ = ref.swiglu_forward_and_per_channel_cast_and_transpose(x, "e4m3", 16, transpose=False)
    assert plain.shape == (2, 1)


@fuzz
@given(PER_CHANNEL.strategy())
def test_torch_per_channel_transpose_against_oracle(case):
    assert all(c.passed for c in check_case(PER_CHANNEL, PER_CHANNEL.impls["torch"], case, case_dir=None))


def test_per_channel_judge_rejects_untransposed_data():
    x = (torch.randn(40, 64, generator=torch.Generator().manual_seed(8)) * 3).to(torch.bfloat16)
    case = Case(params={"fmt": "e4m3", "num_per_tokens": 32, "clamp": None, "transpose": True}, inputs={"x": x})

    def untransposed(**kw):
        return impl.swiglu_forward_and_per_channel_cast_and_transpose(**{**kw, "transpose": False})

    assert all(c.passed for c in check_case(PER_CHANNEL, PER_CHANNEL.impls["torch"], case, case_dir=None))
    with pytest.raises(VerificationError):
        check_case(PER_CHANNEL, torch_impl(untransposed), case, case_dir=None)


@pytest.mark.parametrize("kwargs, error, name", [
    ({"fmt": "e2m1"}, ValueError, "fmt"),
    ({"num_per_tokens": 48}, ValueError, "num_per_tokens"),
    ({"transpose": 1}, TypeError, "transpose"),
    ({"clamp": 0.0}, ValueError, "clamp"),
])
def test_per_channel_bad_arguments(kwargs, error, name):
    with pytest.raises(error, match=name):
        impl.swiglu_forward_and_per_channel_cast_and_transpose(torch.ones(4, 8), **kwargs)


def test_release_2_1_lacks_the_per_channel_transpose(monkeypatch):
    _fake_release(monkeypatch, 2, types.SimpleNamespace())
    with pytest.raises(Unsupported, match="1.0.0 only"):
        adapter.swiglu_forward_and_per_channel_cast_and_transpose(torch.ones(128, 256, dtype=torch.bfloat16))


# -- the TileLang wrapper's host path at num_per_channels = H (launches stubbed, on the CPU) --------------

# The sf storages and layouts of the cast (each option set as the contract allows it).
SF_OPTIONS = (
    {},
    {"round_sf": True},
    {"round_sf": True, "use_ue8m0": True},
    {"round_sf": True, "use_ue8m0": True, "use_packed_ue8m0": True},
    {"use_tma_aligned_col_major_sf": True},
    {"round_sf": True, "use_ue8m0": True, "use_packed_ue8m0": True, "use_tma_aligned_col_major_sf": True},
)
HALF_ROWS = (12, 24, 40, 48, 96)  # num_per_channels = H: not a token block (16, 32, 64, 128); 12 is no chunk


class _RecordedLaunches:
    """Stands in for `compiled_kernel` under `dry_run.stubbed_launches`: keeps each launch's arguments; the SwiGLU
    kernel writes a distinct value into every gradient element and the cast kernel a distinct byte into every data
    byte, so that what the wrapper hands on and crops is visible on the CPU."""

    def __init__(self):
        self.calls: list[tuple[str, tuple, torch.Tensor]] = []  # (kernel, arguments, the first one before the launch)

    def compiled_kernel(self, kernel, config, target):
        assert config in kernel.configs, config
        return lambda *args: self._launch(kernel.name, args)

    def _launch(self, name: str, args: tuple) -> None:
        first = args[0].clone()
        if name == "quant.swiglu_plain":
            out = args[5]  # (x, x_sf, grad, pos, weights, out, ...)
            out.copy_(torch.arange(1, out.numel() + 1, dtype=out.dtype).view(out.shape))
        else:  # quant.token_cast (xw, dw, sf32, sf8, ...)
            data = args[1].view(torch.uint8)
            data.copy_(torch.arange(data.numel()) % 251)
        self.calls.append((name, args, first))


def _npc_h_inputs(hidden: int) -> dict:
    gen = torch.Generator().manual_seed(hidden)
    x = (torch.randn(3, 2 * hidden, generator=gen) * 4).to(torch.float8_e4m3fn)
    return {"x": x, "x_sf": torch.rand(3, 2, generator=gen) + 0.5, "grad_out": torch.randn(3, hidden, generator=gen)}


def _stubbed_backward_cast(monkeypatch, inputs: dict, fmt: str, hidden: int, options: dict):
    from kernels import _tilelang
    from kernels.quant import swiglu_plain
    from tkverify import dry_run

    launches = _RecordedLaunches()
    with dry_run.stubbed_launches():
        monkeypatch.setattr(_tilelang, "compiled_kernel", launches.compiled_kernel)
        got = swiglu_plain.swiglu_backward_and_per_token_cast(**inputs, fmt=fmt, num_per_channels=hidden, **options)
    return got, launches.calls


@pytest.mark.parametrize("hidden", HALF_ROWS)
@pytest.mark.parametrize("options", SF_OPTIONS, ids=lambda o: "-".join(o) or "fp32")
@pytest.mark.parametrize("fmt", ["e4m3", "e2m1"])
def test_tilelang_wrapper_casts_half_rows(monkeypatch, hidden, options, fmt):
    """num_per_channels = H, which the contract allows and the torch implementation takes: the TileLang wrapper
    accepts it, casts the (N, 2H) gradient as two blocks a row (each half zero-padded to whole chunks where
    H % 8 != 0, read in place otherwise), writes the sf in place in the (N, 2) storage and layout asked for,
    crops the data block by block, and returns the torch implementation's shapes, dtypes and strides."""
    pytest.importorskip("tilelang")  # the wrapper module imports its kernel definitions
    inputs = _npc_h_inputs(hidden)
    (x_grad, data, sf), calls = _stubbed_backward_cast(monkeypatch, inputs, fmt, hidden, options)
    for got, want in zip((x_grad, data, sf), impl.swiglu_backward_and_per_token_cast(
            **inputs, fmt=fmt, num_per_channels=hidden, **options)):
        assert (got.shape, got.dtype, got.stride()) == (want.shape, want.dtype, want.stride())

    assert [name for name, _, _ in calls] == ["quant.swiglu_plain", "quant.token_cast"]
    grad = calls[0][1][5]  # the fp32 gradient (N, 2H) the SwiGLU kernel wrote
    assert torch.equal(x_grad, grad.to(torch.bfloat16))
    xw, dw, sf32, sf8, num_chunks, num_blocks, _, _, _, cols, _, _, row0, s0, s1 = calls[1][1][:15]
    slot = -(-hidden // 8) * 8  # a block's chunks
    assert (num_blocks, cols, row0, num_chunks) == (6, 2, 0, 6 * slot // 8)
    words = calls[1][2].view(torch.float32).view(3, 2, slot)  # x's words as the cast kernel gets them
    assert torch.equal(words[:, :, :hidden], grad.view(3, 2, hidden))
    assert not words[:, :, hidden:].any()  # the padding is zeros: it moves no amax
    if hidden % 8 == 0:  # the gradient itself, no copy
        assert xw.data_ptr() == grad.data_ptr()
    assert (s0, s1) == sf.stride()  # the sf written in place, in the layout returned
    assert (sf32 if sf.dtype == torch.float32 else sf8).data_ptr() == sf.data_ptr()
    width = hidden if fmt == "e4m3" else hidden // 2
    kernel_bytes = dw.view(torch.uint8).view(3, 2, -1)
    assert kernel_bytes.shape[2] == (slot if fmt == "e4m3" else slot // 2)
    assert torch.equal(data.view(torch.uint8).view(3, 2, width), kernel_bytes[:, :, :width])


def test_tilelang_wrapper_takes_the_reported_half_row_case(monkeypatch):
    """The case the TileLang per-token cast refused ("num_per_channels must be one of (16, 32, 64, 128) or
    H=24, got 12"): x e4m3 (3, 24) with its sf at npc 12, an fp32 cotangent (3, 12), e4m3, npc 12."""
    pytest.importorskip("tilelang")
    inputs = {"x": torch.ones(3, 24).to(torch.float8_e4m3fn), "x_sf": torch.ones(3, 2), "grad_out": torch.ones(3, 12)}
    (x_grad, data, sf), _ = _stubbed_backward_cast(monkeypatch, inputs, "e4m3", 12, {})
    assert x_grad.shape == (3, 24) and data.shape == (3, 24) and sf.shape == (3, 2)


def test_block_padding_places_each_block_at_a_chunk_and_crops_it_back():
    """token_cast's padding of blocks of n % 8 != 0 elements: every block starts a slot of whole chunks, the
    rest of the slot zero; the crop takes each slot's first codes (e2m1: two a byte)."""
    pytest.importorskip("tilelang")
    from kernels.quant import token_cast

    x = torch.arange(1.0, 1 + 4 * 30).view(4, 30)[:, :24]  # row-strided, two blocks of 12 a row
    padded = token_cast._blocks_zero_padded(x, 12)
    assert padded.shape == (4, 32) and padded.is_contiguous()
    assert torch.equal(padded.view(4, 2, 16)[:, :, :12], x.reshape(4, 2, 12))
    assert not padded.view(4, 2, 16)[:, :, 12:].any()
    codes = torch.arange(4 * 32, dtype=torch.uint8).view(4, 32)
    assert torch.equal(token_cast._blocks_cropped(codes, 2, 12, "e4m3"), codes.view(4, 2, 16)[:, :, :12].reshape(4, 24))
    packed = codes[:, :16].contiguous()  # e2m1: 8 bytes a slot, 6 of them the block's 12 codes
    assert torch.equal(token_cast._blocks_cropped(packed, 2, 12, "e2m1"), packed.view(4, 2, 8)[:, :, :6].reshape(4, 12))
    one_slot = token_cast._blocks_cropped(codes[:, :16].contiguous(), 1, 12, "e4m3")  # per_token_cast's npc = H
    assert torch.equal(one_slot, codes[:, :12]) and one_slot.is_contiguous()
