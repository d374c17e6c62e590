"""The TileLang Engram kernels (kernels.engram) beyond what the differential suite draws.

GPU tests (skipped, with the reason, without CUDA or tilelang): every static
configuration (H = 8 .. 7168, hc = 1 .. 8) and token counts that make the
backward's blocks take several tokens, judged against the spec's error
analysis (forward) and the float64 backward (tkverify.gradients); bitwise
reproducibility of every output, grad_w included; the autograd Function and
engram_gate against the two kernels; T = 0; misaligned views; float64 and
the other bad arguments refused with the eager module's error types.

Source tests (tilelang only, no GPU): the generated CUDA moves every row
with 16-byte vectors (cp.async into the shared-memory ring where there is
one) and calls the accurate libdevice functions.  Without tilelang: the
forward tuning candidates of other thread counts cover the shipped rows and
fit an SM as many times as they ask.
"""

from __future__ import annotations


import numpy as np
import pytest
import torch

import kernels.torch.engram as eager
from strategies import torch_copy
from tkverify import gradients, registry
from tkverify.case import Case
from tkverify.check import check_case
from tkverify.specs import engram as spec_module

SPEC = registry.get("engram.gate")
BF16 = torch.bfloat16


@pytest.fixture(scope="module")
def engram(tilelang_family):
    return tilelang_family("engram")



def make_case(tokens: int, heads: int, hidden: int, seed: int = 0, eps: float = 1e-6, clamp: float = 1e-6) -> Case:
    """Normal x, k, v; a zero row, a row far below sqrt(eps), and rows with z planted at and
    below the clamp (w scaled per head), where there are rows enough."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((tokens, heads, hidden))
    k = rng.standard_normal((tokens, heads, hidden))
    v = rng.standard_normal((tokens, hidden))
    w = rng.standard_normal((heads, hidden)) + 0.5
    if tokens >= 2:
        x[0, 0] = 0.0
        k[-1, -1] *= 2.0**-16
    if tokens >= 3 and heads >= 2:
        x[1, 1] = k[1, 1] * 2.0**-3  # d > 0, far from 0: z planted by scaling w[1]

    def bf16(a):
        return torch_copy(np.asarray(a, dtype=np.float32)).to(BF16)

    case = Case({"eps": eps, "clamp": clamp},
                {"x": bf16(x), "k": bf16(k), "v": bf16(v), "w": torch_copy(w.astype(np.float32))})
    if tokens >= 3 and heads >= 2:
        z = float(spec_module.analyse_forward(**case.inputs, eps=eps, clamp=clamp).exact["z"][1, 1])
        case.inputs["w"][1] *= 0.5 * clamp / z  # z = clamp / 2: the gate is dead on that row
    return case


SHAPES = [
    (1, 1, 8),      # 128-thread CTA, one active thread
    (7, 3, 64),
    (33, 8, 128),
    (300, 2, 1024),  # T > 256: backward blocks of two tokens
    (65, 4, 2048),  # 512 threads, half of them past the row
    (257, 4, 4096),  # the benchmark's configuration
    (9, 8, 4096),   # 512 threads at hc = 8: backward ring + partials = 224.25 KiB of shared memory
    (5, 8, 7168),   # 896 threads, 224 KiB of grad_w partial sums in shared memory
    (19, 4, 7168),
    (4096, 2, 256),  # 256 backward blocks of 16 tokens: grad_w within gamma(T - 1)
]


@pytest.mark.parametrize("shape", SHAPES, ids=[f"T{t}-hc{h}-H{n}" for t, h, n in SHAPES])
def test_forward_and_backward_within_the_error_analysis(engram, shape):
    case = make_case(*shape, seed=sum(shape))
    check_case(SPEC, SPEC.impls["tilelang"], case, case_dir=None)
    checks = gradients.impl_vs_oracle(SPEC, "tilelang", case, seed=1)
    failed = [c.message for c in checks if not c.passed]
    assert not failed, failed


def _cuda(case: Case) -> dict[str, torch.Tensor]:
    return {name: t.cuda() for name, t in case.inputs.items()}


def _grad_out(x: torch.Tensor, seed: int) -> torch.Tensor:
    gen = torch.Generator(device=x.device).manual_seed(seed)
    return torch.randn(x.shape, generator=gen, device=x.device).to(BF16)


def assert_same_bits(a: torch.Tensor, b: torch.Tensor, what: str) -> None:
    assert a.dtype == b.dtype and a.shape == b.shape, what
    assert torch.equal(a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8)), what


@pytest.mark.parametrize("shape", [(1000, 4, 512), (513, 3, 7168)])
def test_every_output_is_reproducible_bit_for_bit(engram, shape):
    i = _cuda(make_case(*shape, seed=3))
    first = engram.engram_gate_fwd(**i)
    grad = _grad_out(i["x"], 4)
    grads = engram.engram_gate_bwd(grad, i["x"], i["k"], i["v"], i["w"], *first[1:])
    for _ in range(2):
        again = engram.engram_gate_fwd(**i)
        for name, a, b in zip(("out", "d", "g", "rx", "rk"), first, again):
            assert_same_bits(a, b, name)
        regrads = engram.engram_gate_bwd(grad, i["x"], i["k"], i["v"], i["w"], *first[1:])
        for name, a, b in zip(("grad_x", "grad_k", "grad_v", "grad_w"), grads, regrads):
            assert_same_bits(a, b, name)


# 512-thread shapes (the tuning candidates' configuration): several rows a CTA, a ragged last token
# block, hc 1 (v_once copies v every row), H below 8 * 512 (idle threads)
TUNE_SHAPES = [(1000, 4, 4096), (301, 3, 2056), (77, 1, 1032), (9, 6, 4096)]


@pytest.mark.parametrize("shape", TUNE_SHAPES, ids=[f"T{t}-hc{h}-H{n}" for t, h, n in TUNE_SHAPES])
def test_tuning_candidates_give_the_shipped_bits(engram, monkeypatch, shape):
    """Every configuration a tuning run may time (kernels.engram.FWD_TUNE_CONFIGS, BWD_TUNE_CONFIGS)
    returns the shipped configuration's bits, every output."""
    i = _cuda(make_case(*shape, seed=11))
    want = engram.engram_gate_fwd(**i)
    grad = _grad_out(i["x"], 5)
    want_grads = engram.engram_gate_bwd(grad, i["x"], i["k"], i["v"], i["w"], *want[1:])
    base = engram.config_for_hidden(shape[2])  # the override key; a candidate where another ships
    for config in engram.FWD_TUNE_CONFIGS:
        with monkeypatch.context() as patch:
            patch.setitem(engram.FWD_OVERRIDES, base, config)
            got = engram.engram_gate_fwd(**i)
        for name, a, b in zip(("out", "d", "g", "rx", "rk"), want, got):
            assert_same_bits(a, b, f"{config} {name}")
    for config in (base,) + engram.BWD_TUNE_CONFIGS:
        with monkeypatch.context() as patch:
            patch.setitem(engram.BWD_OVERRIDES, base, config)
            assert engram.bwd_config(shape[2], shape[1]) == config  # the shared memory fits at these hc H
            got = engram.engram_gate_bwd(grad, i["x"], i["k"], i["v"], i["w"], *want[1:])
        for name, a, b in zip(("grad_x", "grad_k", "grad_v", "grad_w"), want_grads, got):
            assert_same_bits(a, b, f"{config} {name}")


def test_autograd_function_ties_the_two_kernels(engram):
    i = _cuda(make_case(9, 3, 256, seed=7))
    leaves = {n: t.clone().requires_grad_() for n, t in i.items()}
    out = engram.EngramGate.apply(leaves["x"], leaves["k"], leaves["v"], leaves["w"], 1e-5, 1e-6)
    grad = _grad_out(out, 8)
    out.backward(grad)
    saved = engram.engram_gate_fwd(i["x"], i["k"], i["v"], i["w"], 1e-5, 1e-6)
    assert_same_bits(out.detach(), saved[0], "out")
    expected = engram.engram_gate_bwd(grad, i["x"], i["k"], i["v"], i["w"], *saved[1:], 1e-5, 1e-6)
    for name, e in zip("xkvw", expected):
        assert_same_bits(leaves[name].grad, e, name)

    gen = torch.Generator(device="cuda").manual_seed(9)
    wh = (torch.rand(3, 256, generator=gen, device="cuda") + 0.5).requires_grad_()
    we = (torch.rand(3, 256, generator=gen, device="cuda") + 0.5).requires_grad_()
    out = engram.engram_gate(i["x"], i["k"], i["v"], wh, we, 1e-5, 1e-6)
    out.backward(grad)
    w = (wh * we).detach()
    saved = engram.engram_gate_fwd(i["x"], i["k"], i["v"], w, 1e-5, 1e-6)
    grad_w = engram.engram_gate_bwd(grad, i["x"], i["k"], i["v"], w, *saved[1:], 1e-5, 1e-6)[3]
    assert torch.equal(wh.grad, grad_w * we.detach()) and torch.equal(we.grad, grad_w * wh.detach())


def test_empty_tokens(engram):
    i = _cuda(make_case(3, 2, 64))
    i.update(x=i["x"][:0], k=i["k"][:0], v=i["v"][:0])
    out, d, g, rx, rk = engram.engram_gate_fwd(**i)
    assert out.shape == (0, 2, 64) and out.dtype == BF16 and d.shape == (0, 2) and d.dtype == torch.float32
    gx, gk, gv, gw = engram.engram_gate_bwd(torch.empty(0, 2, 64, dtype=BF16, device="cuda"), i["x"], i["k"], i["v"],
                                            i["w"], d, g, rx, rk)
    assert gx.shape == (0, 2, 64) and gv.shape == (0, 64) and torch.equal(gw, torch.zeros(2, 64, device="cuda"))


def test_misaligned_views_give_the_same_bits(engram):
    i = _cuda(make_case(5, 2, 64, seed=11))
    shifted = {}
    for name, t in i.items():
        storage = torch.empty(t.numel() + 1, dtype=t.dtype, device="cuda")
        view = storage[1:].view(t.shape)
        view.copy_(t)
        assert view.data_ptr() % 16 != 0 and view.is_contiguous()
        shifted[name] = view
    want = engram.engram_gate_fwd(**i)
    got = engram.engram_gate_fwd(**shifted)
    for name, a, b in zip(("out", "d", "g", "rx", "rk"), got, want):
        assert_same_bits(a, b, name)
    grad = _grad_out(i["x"], 12)
    want = engram.engram_gate_bwd(grad, *(i[n] for n in "xkvw"), *want[1:])
    got = engram.engram_gate_bwd(grad, *(shifted[n] for n in "xkvw"), *got[1:])
    for name, a, b in zip(("grad_x", "grad_k", "grad_v", "grad_w"), got, want):
        assert_same_bits(a, b, name)


def test_float64_is_refused_naming_the_argument(engram):
    i = {n: t.double() for n, t in _cuda(make_case(3, 2, 64)).items()}
    with pytest.raises(TypeError, match="x"):
        engram.engram_gate_fwd(**i)
    saved = [torch.zeros(3, 2, dtype=torch.float64, device="cuda")] * 4
    with pytest.raises(TypeError, match="x"):
        engram.engram_gate_bwd(i["x"], i["x"], i["k"], i["v"], i["w"], *saved)


def _good():
    return dict(_cuda(make_case(3, 2, 64, seed=13)), eps=1e-6, clamp=1e-6)


FORWARD_CHANGES = [
    (lambda a: a.update(x=a["x"].float()), "x"),
    (lambda a: a.update(x=a["x"][0]), "x"),
    (lambda a: a.update(x=[[1.0]]), "x"),
    (lambda a: a.update(k=a["k"][:, :1]), "k"),
    (lambda a: a.update(k=a["k"].float()), "k"),
    (lambda a: a.update(v=a["v"][:, :32]), "v"),
    (lambda a: a.update(v=a["v"].double()), "v"),
    (lambda a: a.update(w=a["w"].to(BF16)), "w"),
    (lambda a: a.update(w=a["w"].t().contiguous().t()), "w"),
    (lambda a: a.update(w=a["w"][:1]), "w"),
    (lambda a: a.update(k=a["k"].cpu()), "k"),
    (lambda a: a.update(x=a["x"].transpose(1, 2).contiguous().transpose(1, 2)), "x"),
    (lambda a: a.update(eps=0.0), "eps"),
    (lambda a: a.update(eps=float("nan")), "eps"),
    (lambda a: a.update(eps=True), "eps"),
    (lambda a: a.update(clamp=-1e-6), "clamp"),
    (lambda a: a.update(clamp="1e-6"), "clamp"),
    (lambda a: a.update(x=a["x"].double(), k=a["k"].double(), v=a["v"].double()), "w"),
]


@pytest.mark.parametrize("change, names", FORWARD_CHANGES)
def test_forward_refuses_what_the_eager_forward_refuses(engram, change, names):
    args = _good()
    change(args)
    with pytest.raises(Exception) as eager_error:
        eager.engram_gate_fwd(**args)
    with pytest.raises(eager_error.type, match=names):
        engram.engram_gate_fwd(**args)


BACKWARD_CHANGES = [
    (lambda a: a.update(grad_out=a["grad_out"].float()), "grad_out"),
    (lambda a: a.update(grad_out=a["grad_out"][:1]), "grad_out"),
    (lambda a: a.update(grad_out=a["grad_out"].cpu()), "grad_out"),
    (lambda a: a.update(d=a["d"][:1]), "d"),
    (lambda a: a.update(g=a["g"].to(BF16)), "g"),
    (lambda a: a.update(rx=a["rx"].double()), "rx"),
    (lambda a: a.update(rk=a["rk"].t()), "rk"),
    (lambda a: a.update(clamp=0.0), "clamp"),
    (lambda a: a.update(x=a["x"].float()), "x"),
]


@pytest.mark.parametrize("change, names", BACKWARD_CHANGES)
def test_backward_refuses_what_the_eager_backward_refuses(engram, change, names):
    args = _good()
    _, d, g, rx, rk = eager.engram_gate_fwd(**args)
    args.update(grad_out=torch.ones(3, 2, 64, dtype=BF16, device="cuda"), d=d, g=g, rx=rx, rk=rk)
    change(args)
    with pytest.raises(Exception) as eager_error:
        eager.engram_gate_bwd(**args)
    with pytest.raises(eager_error.type, match=names):
        engram.engram_gate_bwd(**args)


@pytest.mark.parametrize("shape", [(2, 2, 60), (2, 2, 7176), (2, 9, 64)])
def test_shapes_outside_the_kernels_domain_are_refused(engram, shape):
    args = _cuda(make_case(*shape))
    eager.engram_gate_fwd(**args)  # fine for the eager implementation
    with pytest.raises(ValueError, match="x"):
        engram.engram_gate_fwd(**args)


def test_cpu_tensors_are_refused(engram):
    args = make_case(2, 2, 64).inputs
    with pytest.raises(ValueError, match="x"):
        engram.engram_gate_fwd(**args)


# -- the generated source (no GPU) -----------------------------------------------------------


def test_generated_cuda_uses_16_byte_vectors_and_accurate_maths(tilelang_only):
    from kernels import _tilelang
    from kernels import engram

    for kernel, loads, stores in ((engram.GATE_FWD, ("x", "k", "v"), ("out",)),
                                  (engram.GATE_BWD, ("grad_out", "x", "k", "v"), ("grad_x", "grad_k", "grad_v"))):
        for config in kernel.configs:
            source = _tilelang.lower_to_cuda(kernel.build(config))
            body = source[source.index("__global__ void __launch_bounds__"):]
            ringed = kernel is engram.GATE_FWD or config.threads <= engram.BWD_RING_MAX_THREADS
            for name in loads:
                # through the shared-memory ring (16-byte cp.async) or straight into registers
                read = "cp_async_gs<16>(" if ringed else f"= *(int4*)({name} + "
                assert read in body and (f"(&({name}[" in body or not ringed), \
                    f"{kernel.name} {config}: {name} not read as 16-byte vectors"
            if ringed:
                assert "cp_async_wait<" in body and "cp_async_commit()" in body, f"{kernel.name} {config}"
                # prologue + loop, each chunk set of a thread written out (the forward's chunks)
                assert body.count("cp_async_gs<16>(") == 2 * len(loads) * config.chunks, \
                    f"{kernel.name} {config}: prologue + loop"
            for name in stores:
                # a plain 16-byte vector store, or st.global.cs of 16 bytes (a tuning candidate's streaming stores)
                store = f"{_tilelang.STORE16_STREAM}((&({name}[" if config.streaming else f"*(uint4*)({name} + "
                assert store in body, f"{kernel.name} {config}: {name} not written as 16-byte vectors"
            assert "*(float4*)(w + " in body, f"{kernel.name} {config}: w not read as float4"
            for fast in ("__expf", "__fdividef", "__fsqrt", "__frsqrt"):
                assert fast not in body, f"{kernel.name} {config}: {fast}"
    fwd = _tilelang.lower_to_cuda(engram.GATE_FWD.build(engram.GATE_CONFIGS[0]))
    assert "expf(" in fwd and "sqrtf(" in fwd and "rsqrtf(" in fwd


def test_forward_candidates_of_other_thread_counts_serve_the_shipped_rows(monkeypatch):
    """A forward tuning candidate (fewer threads, `chunks` chunks of a row each) covers the rows of the
    shipped configuration it overrides, names its residency, and that many of its CTAs fit an SM's
    shared memory (sm_90: 228 KiB, 1 KiB of it reserved a CTA) and registers (ptxas' cap, >= 32)."""
    from kernels import engram

    shipped = engram.config_for_hidden(4096)
    for config in engram.FWD_TUNE_CONFIGS:
        assert engram.row_chunks(config) == engram.row_chunks(shipped), config
        resident = engram.fwd_resident(config)
        assert resident * (engram._fwd_shared_bytes(config) + 1024) <= 228 * 1024, config
        assert 65536 // (resident * config.threads) >= 32, config
        assert config.threads * config.chunks // 32 <= 32, config
        with monkeypatch.context() as patch:
            patch.setitem(engram.FWD_OVERRIDES, shipped, config)
            assert engram.fwd_config(4096) == engram.fwd_config(1032) == config
    # the shipped configurations' own residency, unchanged
    assert [engram.fwd_resident(c) for c in engram.GATE_CONFIGS] == [8, 2, 1]
    # an override that does not cover H is not used
    with monkeypatch.context() as patch:
        patch.setitem(engram.FWD_OVERRIDES, shipped, engram.GateConfig(256, ctas_per_sm=4))
        assert engram.fwd_config(4096) == engram.FWD_SHIPPED.get(shipped, shipped) != shipped
        assert engram.fwd_config(2048).threads == 256
