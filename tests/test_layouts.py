"""Layouts as a drawn dimension (strategies/layouts.py), the layouts each implementation declares, and the
eager implementations on row-strided inputs: the same bits as on contiguous ones, clear errors otherwise."""

from __future__ import annotations

import collections
from unittest import mock

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import kernels.moe
import kernels.quant
import kernels.transpose
from kernels.torch import moe as torch_moe, quant as torch_quant, transpose as torch_transpose
from kernels.torch._checks import rows_aligned, span_view
from strategies import layouts
from strategies.layouts import BATCH_SLICE, CONTIGUOUS, LAYOUTS, OTHER, ROW_STRIDED
from tkverify import registry
from tkverify.case import Case
from tkverify.suite import drawing_layouts, verify

# The ops whose eager implementation takes a row stride, and the input that takes it.
ROW_INPUTS = {
    "quant.per_token_cast": "x", "quant.per_token_cast_with_sf_only": "x",
    "quant.per_token_cast_with_precomputed_sf": "x", "quant.per_block_cast": "x", "quant.per_channel_cast": "x",
    "quant.per_block_cast_with_sf_only": "x", "quant.per_block_cast_with_precomputed_sf": "x",
    "quant.per_token_cast_and_cast_back": "x",
    "quant.swiglu_forward_and_per_token_cast": "x", "quant.swiglu": "x",
    "quant.swiglu_forward_and_per_channel_cast_and_transpose": "x", "transpose.transpose": "x",
    "transpose.batched_transpose": "x", "moe.topk_gate": "scores",
}
# Of those, the ops whose TileLang kernel reads the input in place at a row stride.
TILELANG_ROW_INPUTS = {op: ROW_INPUTS[op] for op in (
    "quant.per_token_cast", "quant.per_token_cast_with_sf_only", "quant.per_token_cast_with_precomputed_sf",
    "quant.swiglu_forward_and_per_token_cast", "transpose.transpose", "transpose.batched_transpose",
    "moe.topk_gate", "quant.per_token_cast_and_cast_back")}
QUICK = settings(max_examples=15, derandomize=True, database=None, deadline=None,
                 suppress_health_check=list(HealthCheck))


def _bits(t: torch.Tensor) -> torch.Tensor:
    """The bytes of `t` in row-major order (a fresh tensor: `contiguous` keeps the stride of a size-1 dim)."""
    return t.new_empty(t.shape).copy_(t).view(torch.uint8) if t.numel() else t.new_empty(t.shape)


# -- the layouts ------------------------------------------------------------------------------------


def test_each_layout_keeps_the_values_and_fills_the_rest_with_nan():
    x = torch.randn(3, 5)
    strided = layouts.row_strided(x, 4)
    assert strided.stride() == (9, 1) and layouts.layout_class(strided) == ROW_STRIDED
    assert torch.equal(strided, x) and torch.isnan(strided.as_strided((3, 4), (9, 1), 5)).all()
    sliced = layouts.batch_slice(x)
    assert sliced.is_contiguous() and sliced.storage_offset() == 5 and layouts.layout_class(sliced) == BATCH_SLICE
    assert torch.equal(sliced, x) and torch.isnan(sliced.as_strided((5,), (1,), 0)).all()
    assert torch.isnan(sliced.as_strided((5,), (1,), 20)).all()
    assert layouts.layout_class(x) == CONTIGUOUS and layouts.layout_class(x.t()) == OTHER
    # 3-D: the padding sits after each row of every batch entry
    batched = layouts.row_strided(torch.ones(2, 3, 4, dtype=torch.bfloat16), 1)
    assert batched.stride() == (15, 5, 1) and layouts.layout_class(batched) == ROW_STRIDED


def test_paddings_and_the_classes_a_tensor_can_take():
    assert layouts.paddings(torch.zeros(2, 5, dtype=torch.bfloat16)) == [8, 5, 1]  # 16 bytes, a row, one
    assert layouts.paddings(torch.zeros(2, 4)) == [4, 1]
    assert layouts.applicable(torch.zeros(2, 3), LAYOUTS) == list(LAYOUTS)
    assert layouts.applicable(torch.zeros(3), LAYOUTS) == [CONTIGUOUS, BATCH_SLICE]  # no rows to pad
    assert layouts.applicable(torch.zeros(0, 3), LAYOUTS) == [CONTIGUOUS]
    assert layouts.applicable(torch.zeros(2, 3), (ROW_STRIDED,)) == [ROW_STRIDED]


def test_unknown_layouts_are_refused_by_name():
    with pytest.raises(ValueError, match="'x'.*diagonal"):
        layouts.check_layouts({"x": ("contiguous", "diagonal")})
    with pytest.raises(ValueError, match="diagonal"):
        registry.Impl("mine", lambda x: x, layouts={"x": ("diagonal",)})


def _cases() -> st.SearchStrategy[Case]:
    x = st.integers(1, 4).map(lambda n: torch.arange(n * 6, dtype=torch.float32).reshape(n, 6))
    return st.builds(lambda x: Case({}, {"x": x, "w": torch.ones(2, 2)}), x)


def test_with_layouts_draws_each_declared_class_tags_it_and_leaves_the_rest():
    """Every class declared for x is drawn with its event; w, not declared, stays contiguous; values kept."""
    drawn, events = collections.Counter(), collections.Counter()

    @QUICK
    @given(case=layouts.with_layouts(_cases(), {"x": LAYOUTS}))
    def run(case):
        x = case.inputs["x"]
        assert torch.equal(x, torch.arange(x.numel(), dtype=torch.float32).reshape(x.shape))
        assert layouts.layout_class(case.inputs["w"]) == CONTIGUOUS
        drawn[layouts.case_layouts(case)["x"]] += 1

    with mock.patch.object(layouts.hypothesis, "event", lambda text: events.update([text])):
        run()
    assert set(drawn) == set(LAYOUTS)
    assert {e for e in events} == {f"layout: x={c}" for c in LAYOUTS}


def test_with_layouts_keeps_a_strategy_that_declares_nothing_beyond_contiguous():
    strategy = _cases()
    assert layouts.with_layouts(strategy, {}) is strategy
    assert layouts.with_layouts(strategy, {"x": (CONTIGUOUS,)}) is strategy


def test_with_layouts_keeps_a_layout_the_strategy_drew_itself():
    column_major = torch.zeros(6, 4).t()

    @QUICK
    @given(case=layouts.with_layouts(st.just(Case({}, {"sf": column_major})), {"sf": LAYOUTS}))
    def run(case):
        assert case.inputs["sf"] is column_major

    run()


# -- what each implementation declares -----------------------------------------------------------------


def test_the_implementations_declare_the_row_strides_they_take():
    """The eager implementations and the TileLang wrappers that read a row stride in place every layout;
    the others none beyond contiguous (their ci examples do not move)."""
    for op, name in ROW_INPUTS.items():
        spec = registry.get(op)
        assert spec.impls["torch"].layouts == {name: LAYOUTS}, op
        if op in TILELANG_ROW_INPUTS:
            assert spec.impls["tilelang"].layouts == {name: LAYOUTS}, op
            assert drawing_layouts(spec, spec.impls["tilelang"]) is not spec
        else:
            assert spec.impls["tilelang"].layouts == {}, op
            assert drawing_layouts(spec, spec.impls["tilelang"]) is spec
    declared = {(s.name, n) for s in registry.all_specs() for n, i in s.impls.items() if i.layouts}
    assert {op for op, impl in declared if impl == "torch"} == set(ROW_INPUTS)
    assert {op for op, impl in declared if impl == "tilelang"} == set(TILELANG_ROW_INPUTS)


def test_the_tile_kernels_adapter_declares_the_row_strides_its_release_takes():
    for spec in registry.all_specs():
        impl = spec.impls.get("tile_kernels")
        if impl is None:
            continue
        if spec.name in ("quant.per_token_cast", "transpose.transpose", "transpose.batched_transpose"):
            assert impl.layouts == {"x": (CONTIGUOUS, ROW_STRIDED)}, spec.name
        else:
            assert impl.layouts == {}, spec.name


def test_the_differential_suite_draws_the_declared_layouts():
    spec = registry.get("transpose.transpose")
    seen = collections.Counter()
    verify(spec, spec.impls["torch"], record=lambda spec, impl, comparisons, case, timings:
           seen.update(layouts.case_layouts(case).values()))
    assert set(seen) == set(LAYOUTS), seen


# -- the eager implementations on strided inputs -------------------------------------------------------


def _call(op: str, case: Case):
    impl = registry.get(op).impls["torch"]
    out = impl.function()(**case.to("cpu"), **case.params)
    return out if isinstance(out, tuple) else (out,)


@pytest.mark.parametrize("op", sorted(ROW_INPUTS))
def test_a_strided_input_gives_the_bits_of_the_contiguous_one(op):
    name = ROW_INPUTS[op]

    @QUICK
    @given(case=registry.get(op).strategy(), layout=st.sampled_from((ROW_STRIDED, BATCH_SLICE)),
           pad=st.sampled_from((1, 3, 64)))
    def run(case, layout, pad):
        t = case.inputs[name]
        if layout not in layouts.applicable(t, LAYOUTS):
            return
        relaid = layouts.row_strided(t, pad) if layout == ROW_STRIDED else layouts.batch_slice(t)
        assert layouts.layout_class(relaid) == layout
        strided = _call(op, Case(case.params, {**case.inputs, name: relaid}))
        plain = _call(op, case)
        assert len(strided) == len(plain)
        for a, b in zip(strided, plain):
            assert a.dtype == b.dtype and a.shape == b.shape and a.stride() == b.stride(), op
            assert torch.equal(_bits(a), _bits(b)), op

    run()


def test_transpose_and_the_casts_read_a_row_strided_x_in_place():
    """No copy of x: the eager transpose reads the view (its result holds the view's values), and a float32
    cast's arithmetic starts from the view itself (x.float() of float32 is x)."""
    x = layouts.row_strided(torch.randn(4, 6), 2)
    assert x.float().data_ptr() == x.data_ptr()
    assert torch.equal(torch_transpose.transpose(x), x.t())
    data, sf = torch_quant.per_token_cast(x, "e4m3", 6)
    assert torch.equal(_bits(data), _bits(torch_quant.per_token_cast(x.contiguous(), "e4m3", 6)[0]))


BAD_LAYOUTS = {
    "inner stride": (lambda t: torch.repeat_interleave(t, 2, dim=-1)[..., ::2], "contiguous last dimension"),
    "overlapping": (lambda t: t[:1].expand(t.shape), "overlapping elements"),
}
EAGER = {
    "quant": (lambda x: torch_quant.per_token_cast(x, "e4m3", 8), "x"),
    "transpose": (torch_transpose.transpose, "x"),
    "batched_transpose": (lambda x: torch_transpose.batched_transpose(x[None]), "x"),
    "topk_gate": (lambda x: torch_moe.topk_gate(x, 2), "scores"),
}


@pytest.mark.parametrize("bad", sorted(BAD_LAYOUTS))
@pytest.mark.parametrize("fn", sorted(EAGER))
def test_the_eager_implementations_refuse_other_layouts_by_name(fn, bad):
    spoil, message = BAD_LAYOUTS[bad]
    call, name = EAGER[fn]
    x = spoil(torch.randn(4, 8))
    with pytest.raises(ValueError, match=f"^{name} must .*{message}.* got strides"):
        call(x)


TILELANG = {
    "per_block_cast": (lambda x: kernels.quant.per_block_cast(x, "e4m3", (32, 32)), "x"),
    "per_channel_cast": (lambda x: kernels.quant.per_channel_cast(x, "e4m3", 16), "x"),
}


@pytest.mark.parametrize("fn", sorted(TILELANG))
def test_the_tilelang_wrappers_refuse_a_row_stride_by_name(fn):
    """Their kernels read dense rows: a row-strided input the eager checks let through is refused before
    any device or kernel is touched (so this runs on the CPU)."""
    call, name = TILELANG[fn]
    x = layouts.row_strided(torch.randn(64, 32), 5)
    with pytest.raises(ValueError, match=f"^{name} must be contiguous \\(the TileLang kernel reads it as dense "
                                         f"rows and takes no row stride\\), got strides"):
        call(x)


IN_PLACE = {
    "per_token_cast": (lambda x: kernels.quant.per_token_cast(x, "e4m3", 16), "x"),
    "per_token_cast_with_sf_only": (lambda x: kernels.quant.per_token_cast_with_sf_only(x, "e4m3", 16), "x"),
    "per_token_cast_with_precomputed_sf": (lambda x: kernels.quant.per_token_cast_with_precomputed_sf(
        x, torch.ones(x.shape[0], x.shape[1] // 16), "e4m3", 16), "x"),
    "swiglu": (lambda x: kernels.quant.swiglu_forward_and_per_token_cast(x, "e4m3", 16), "x"),
    "transpose": (kernels.transpose.transpose, "x"),
    "batched_transpose": (lambda x: kernels.transpose.batched_transpose(x[None]), "x"),
    "topk_gate": (lambda x: kernels.moe.topk_gate(x, 2), "scores"),
}


@pytest.mark.parametrize("fn", sorted(IN_PLACE))
def test_the_in_place_wrappers_let_a_row_stride_through_to_the_device_check(fn):
    """No refusal of the layout: a row-strided CPU input passes every argument check but the CUDA one."""
    call, name = IN_PLACE[fn]
    with pytest.raises(ValueError, match=f"^{name} must be on a CUDA device"):
        call(layouts.row_strided(torch.randn(64, 32), 5))


@pytest.mark.parametrize("bad", sorted(BAD_LAYOUTS))
@pytest.mark.parametrize("fn", sorted(IN_PLACE))
def test_the_in_place_wrappers_refuse_other_layouts_by_name(fn, bad):
    spoil, message = BAD_LAYOUTS[bad]
    call, name = IN_PLACE[fn]
    with pytest.raises(ValueError, match=f"^{name} must .*{message}.* got strides"):
        call(spoil(torch.randn(4, 32)))


def test_span_view_covers_a_strided_tensor_in_place():
    x = layouts.row_strided(torch.arange(12.0).reshape(3, 4), 5)
    span = span_view(x)
    assert span.data_ptr() == x.data_ptr() and span.numel() == 2 * 9 + 4
    assert torch.equal(span.as_strided((3, 4), (9, 1)), x)
    assert span_view(x[1:2]).numel() == 4  # one row: its own length, whatever stride torch reports
    batched = torch.zeros(4, 3, 8)[:, :2, :5]
    assert span_view(batched).numel() == 3 * 24 + 1 * 8 + 5


def test_the_transpose_takes_the_vectorized_variant_where_rows_stay_aligned():
    """The host's choice (no GPU): 16-byte aligned rows and batch entries vectorized, others scalar."""
    x = torch.zeros(2, 64, 64, dtype=torch.bfloat16)
    out = torch.zeros(2, 64, 64, dtype=torch.bfloat16)
    assert kernels.transpose._choose_config(layouts.row_strided(x, 8), out, 2).vectorized
    assert kernels.transpose._choose_config(layouts.batch_slice(x), out, 2).vectorized  # 8 KiB offset
    for unaligned in (layouts.row_strided(x, 1), layouts.row_strided(x, 4), x[:, :, 1:57]):
        assert not kernels.transpose._choose_config(unaligned, out, 2).vectorized


def test_the_token_cast_kernel_reads_aligned_rows_in_place_and_copies_the_others():
    """The host side of a launch (no GPU): rows on 16-byte boundaries are the kernel's x as they are, and
    its words span them in the same memory, padding included; others become a contiguous copy."""
    from kernels.quant import token_cast

    x = torch.randn(6, 64).to(torch.bfloat16)
    for pad in (8, 64, 128):
        strided = layouts.row_strided(x, pad)
        assert rows_aligned(strided, 16) and token_cast._vector_rows(strided) is strided
        words = token_cast._row_words(strided)
        assert words.data_ptr() == strided.data_ptr() and words.numel() == (5 * (64 + pad) + 64) // 2
        assert token_cast._row_stride(strided) == 64 + pad
        # the kernel's row padding in 16-byte vectors: the row stride less the row
        assert (token_cast._row_stride(strided) - 64) * 2 // 16 == pad // 8
    assert token_cast._row_stride(layouts.row_strided(x, 8)[2:3]) == 64  # one row: its own length
    odd_start = torch.randn(6 * 64 + 1).to(torch.bfloat16)[1:].view(6, 64)  # contiguous, 2 bytes in
    for unaligned in (layouts.row_strided(x, 1), layouts.row_strided(x, 3), layouts.row_strided(x, 72)[:, 1:9],
                      odd_start):
        assert not rows_aligned(unaligned, 16)
        copy = token_cast._vector_rows(unaligned)
        assert copy.is_contiguous() and copy.data_ptr() % 16 == 0 and torch.equal(copy, unaligned)
    assert rows_aligned(layouts.row_strided(x, 1)[:1], 16)  # one row: no stride to speak of


# -- the report -----------------------------------------------------------------------------------------


def test_the_layouts_drawn_are_labelled_and_tabled_per_op_and_impl():
    from tkverify.report.render import layouts_markdown

    case = Case({}, {"x": layouts.row_strided(torch.ones(2, 3), 1), "w": torch.ones(2, 2), "k": torch.ones(2)})
    assert layouts.layout_labels(case, {"x": LAYOUTS, "w": (CONTIGUOUS,)}) == ["x=row_strided"]
    assert layouts.layout_labels(case, {}) == []
    table = "\n".join(layouts_markdown({("transpose.transpose", "torch"): {"x=contiguous": 45, "x=row_strided": 27},
                                        ("moe.topk_gate", "torch"): {"scores=batch_slice": 4}}))
    assert "## Layouts drawn" in table
    assert "| moe.topk_gate | torch | scores | 0 | 0 | 4 | 0 |" in table
    assert "| transpose.transpose | torch | x | 45 | 27 | 0 | 0 |" in table
    assert table.index("moe.topk_gate") < table.index("transpose.transpose")
    assert layouts_markdown({}) == []
