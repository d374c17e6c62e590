"""Kernel-path coverage (tkverify.coverage): the launch recorder, the labels of an example, the table and
coverage.json of a report, and the committed coverage list's gaps (TKVERIFY_COVERAGE=<coverage.json>)."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import pytest
import torch

from kernels import _tilelang
from kernels.transpose import BATCHED_TRANSPOSE, TransposeConfig
from tkverify import coverage, gradients, registry
from tkverify.case import Case
from tkverify.report import SpeedRow
from tkverify.report.reach import coverage_markdown, read_coverage, short_config_labels

SHIPPED = TransposeConfig("int32", False)  # the scalar configuration: every boundary class applies


def fake_transpose(x):
    """An implementation that asks for a shipped kernel as a wrapper does before its launch (no GPU here)."""
    if _tilelang._LISTENERS:
        _tilelang._note_launch(BATCHED_TRANSPOSE.name, SHIPPED)
    return x.transpose(-1, -2).contiguous()


def test_recorder_hears_only_inside_its_block():
    with _tilelang.launches() as outer:
        _tilelang._note_launch("k", 1)
        with _tilelang.launches() as inner:
            _tilelang._note_launch("k", 2)
        _tilelang._note_launch("k", 3)
    _tilelang._note_launch("k", 4)
    assert outer == [("k", 1), ("k", 2), ("k", 3)] and inner == [("k", 2)]
    assert not _tilelang._LISTENERS


def test_compiled_kernel_records_before_it_refuses():
    with _tilelang.launches() as heard, pytest.raises(ValueError):
        _tilelang.compiled_kernel(BATCHED_TRANSPOSE, "not a config", _tilelang.SM90)
    assert heard == [(BATCHED_TRANSPOSE.name, "not a config")]


def test_listening_impl_labels_its_launch_and_boundary_classes():
    listener = coverage.Listener()
    impl = coverage.listening(registry.Impl("fake", fake_transpose, device="cpu"), listener)
    case = Case({}, {"x": torch.zeros(2, 1, 70, dtype=torch.float32)})  # M = 1, N = 70: partial tiles
    impl.function()(**case.inputs)
    classes, labels = coverage.example_labels(case, listener)
    head = f"transpose.batched_transpose | {SHIPPED!r}"
    assert labels == [head, f"{head} | single_row", f"{head} | partial_tile_m", f"{head} | partial_tile_n"]
    assert classes == [] and listener.take() is None  # outside hypothesis no tags; a label is read once


def test_table_and_list_show_reached_configs_and_gaps():
    head = f"transpose.batched_transpose | {SHIPPED!r}"
    row = SpeedRow("transpose.batched_transpose", "tilelang", coverage={head: 3, f"{head} | partial_tile_n": 2})
    other = TransposeConfig("int16", False)
    shipped = {"transpose.batched_transpose": [SHIPPED, other]}
    listed = coverage.coverage_list({(row.op, row.impl): row.coverage}, shipped)
    entry = listed["transpose.batched_transpose"][repr(SHIPPED)]
    assert entry["examples"] == 3 and entry["classes"] == {"single_row": 0, "partial_tile_m": 0, "partial_tile_n": 2}
    assert coverage.gaps(listed) == [
        f"transpose.batched_transpose {SHIPPED!r}: never with single_row",
        f"transpose.batched_transpose {SHIPPED!r}: never with partial_tile_m",
        f"transpose.batched_transpose {other!r}: never launched"]
    text = "\n".join(coverage_markdown([row], shipped))
    assert "**gap**" in text and "partial_tile_n 2" in text and "3 gaps" in text


def test_the_table_names_a_configuration_by_the_fields_that_tell_it_apart():
    labels = ["GateConfig(threads=128, stages=0, block=(1, 128))", "GateConfig(threads=512, stages=0, block=(1, 64))",
              "GateConfig(threads=512, stages=0, block=(1, 128))"]
    assert short_config_labels(labels) == {labels[0]: "GateConfig(threads=128, block=(1, 128))",
                                           labels[1]: "GateConfig(threads=512, block=(1, 64))",
                                           labels[2]: "GateConfig(threads=512, block=(1, 128))"}
    assert short_config_labels(["HashConfig()"]) == {"HashConfig()": "HashConfig()"}  # the only one: in full
    assert short_config_labels(["A(1)", "A(2)"]) == {"A(1)": "A(1)", "A(2)": "A(2)"}  # not field=value: in full
    assert short_config_labels(["A(x=1)", "B(y=1)"]) == {"A(x=1)": "A(x=1)", "B(y=1)": "B(y=1)"}


def test_candidates_are_exempt():
    shipped = coverage.shipped_configs()
    for name, kernel in _tilelang.kernel_defs().items():
        assert not set(kernel.candidates) & set(shipped[name])


def test_every_boundary_table_entry_names_a_kernel():
    assert set(coverage.boundary_classes()) <= set(_tilelang.kernel_defs())


@pytest.mark.skipif(not os.environ.get("TKVERIFY_COVERAGE"), reason="TKVERIFY_COVERAGE=<a report's coverage.json> "
                    "checks a committed coverage list")
def test_committed_coverage_list_has_no_gap():
    missing = coverage.gaps(read_coverage(Path(os.environ["TKVERIFY_COVERAGE"])))
    assert not missing, "\n".join(missing)


# ------------------------------------------------------------- the gradient checks' coverage


def _classes(kernel: str, case: Case, config) -> list[str]:
    return [b.name for b in coverage.boundary_classes()[kernel] if b.applies(config) and b.hit(case, config)]


def test_gradient_checks_record_the_backward_launches_per_judged_example(monkeypatch):
    """A backward that asks for a shipped kernel (as a wrapper does before its launch) is heard once per judged
    example, under the row ``<op> (backward)``, with its boundary classes; its forward's launches are not."""
    from kernels.mhc.expand import EXPAND_TO_MHC, EXPAND_TO_MHC_BWD, ExpandConfig
    from kernels.torch import mhc_head

    spec = registry.get("mhc.expand_to_mhc")
    scalar = ExpandConfig(False)

    def forward(x, m):
        _tilelang._note_launch(EXPAND_TO_MHC.name, scalar)
        return mhc_head.expand_to_mhc(x, m)

    def backward(grad_out, x, m):
        _tilelang._note_launch(EXPAND_TO_MHC_BWD.name, scalar)
        return mhc_head.expand_to_mhc_bwd(grad_out, x, m)

    bw = dataclasses.replace(spec.backward, impls={"fake": registry.Impl("fake", backward, device="cpu")})
    fake = dataclasses.replace(spec, impls={"fake": registry.Impl("fake", forward, device="cpu")}, backward=bw)
    heard, verdicts = [], []
    gradients.verify(fake, "fake", record=lambda check, desc: verdicts.append(check),
                     record_coverage=lambda op, impl, classes, paths: heard.append((op, impl, paths)))
    assert heard and verdicts
    head = f"mhc.expand_to_mhc_bwd | {scalar!r}"
    for op, impl, paths in heard:
        assert (op, impl) == ("mhc.expand_to_mhc (backward)", "fake")
        assert paths[0] in (head, coverage.NO_LAUNCH) and all(p.startswith(paths[0]) for p in paths)
        assert all(not p.startswith("mhc.expand_to_mhc |") for p in paths)
    assert any(f"{head} | hidden_tail" in paths for _, _, paths in heard)  # the strategy draws H % 8 != 0


def test_gradient_coverage_skips_an_example_whose_checks_raise():
    """An example whose checks raise (a refusal) records nothing, and leaves nothing for the next one."""
    listener_paths = []
    spec = registry.get("mhc.expand_to_mhc")
    calls = []

    def backward(grad_out, x, m):
        calls.append(1)
        _tilelang._note_launch("mhc.expand_to_mhc_bwd", ("refused",))
        raise registry.Unsupported("refused on purpose")

    from kernels.torch import mhc_head

    bw = dataclasses.replace(spec.backward, impls={"fake": registry.Impl("fake", backward, device="cpu")})
    fake = dataclasses.replace(spec, impls={"fake": registry.Impl("fake", mhc_head.expand_to_mhc, device="cpu")},
                               backward=bw)
    covered, recording = gradients.covering(fake, "fake", None, lambda *a: listener_paths.append(a))
    case = Case({"m": 2}, {"x": torch.zeros(1, 3, 8, dtype=torch.bfloat16)})
    with pytest.raises(registry.Unsupported):
        gradients.check_gradients(covered, "fake", case, 1, record=recording)
    assert calls and not listener_paths


def test_collector_folds_gradient_coverage_into_the_coverage_list():
    from kernels.mhc.post_bwd import PostBwdConfig
    from tkverify.report.shards import Collector

    collector = Collector()
    config = PostBwdConfig(True, 4)
    head = f"mhc.post_bwd | {config!r}"
    collector.add_coverage(gradients.backward_row("mhc.post"), "tilelang", [], [head, f"{head} | padded_streams"])
    listed = coverage.coverage_list({k: r.coverage for k, r in collector.speed.items()},
                                    {"mhc.post_bwd": [config]})
    entry = listed["mhc.post_bwd"][repr(config)]
    assert entry["examples"] == 1 and entry["ops"] == ["mhc.post (backward)[tilelang]"]
    assert entry["classes"] == {"single_row": 0, "padded_streams": 1}  # hidden_tail: the scalar config's only


# ------------------------------------------------- boundary classes read from the wrappers' tile sizes


def test_token_vector_classes():
    from kernels.mhc.expand import ExpandConfig

    one = Case({"m": 2}, {"x": torch.zeros(1, 1, 1028, dtype=torch.bfloat16)})  # 1 token, 1028 = 1024 + 4
    whole = Case({"m": 2}, {"x": torch.zeros(2, 3, 1024, dtype=torch.bfloat16)})
    for kernel in ("mhc.expand_to_mhc", "mhc.expand_to_mhc_bwd"):
        assert _classes(kernel, one, ExpandConfig(False)) == ["single_row", "partial_block", "hidden_tail"]
        assert _classes(kernel, whole, ExpandConfig(True)) == []
        assert _classes(kernel, whole, ExpandConfig(False)) == []  # 1024 scalar lanes: 8 whole CTAs
        tail = Case({"m": 2}, {"x": torch.zeros(2, 1032, dtype=torch.bfloat16)})
        assert _classes(kernel, tail, ExpandConfig(True)) == ["partial_block"]  # 129 vectors: a second CTA


def test_mhc_backward_classes():
    from kernels.mhc.post_bwd import PostBwdConfig
    from kernels.mhc.sinkhorn_kernels import SinkhornConfig
    from kernels.mhc.split_mixes_bwd import SplitBwdConfig

    post = Case({}, {"x": torch.zeros(1, 1, 12), "comb": torch.zeros(1, 1, 3, 3)})
    assert _classes("mhc.post_bwd", post, PostBwdConfig(False, 8)) == ["single_row", "hidden_tail", "padded_streams"]
    assert _classes("mhc.post_bwd", post, PostBwdConfig(True, 4)) == ["single_row", "padded_streams"]
    full = Case({}, {"x": torch.zeros(2, 3, 16), "comb": torch.zeros(2, 3, 4, 4)})
    assert _classes("mhc.post_bwd", full, PostBwdConfig(True, 4)) == []
    mixes = Case({}, {"mixes": torch.zeros(2, 64, 24)})  # m = 4: 24 = 4 * 6; 128 tokens, one whole CTA
    assert _classes("mhc.pre_split_mixes_bwd", mixes, SplitBwdConfig(4)) == []
    assert _classes("mhc.pre_split_mixes_bwd", mixes, SplitBwdConfig(8)) == ["padded_mixes"]
    assert _classes("mhc.pre_split_mixes_bwd", Case({}, {"mixes": torch.zeros(1, 1, 15)}), SplitBwdConfig(4)) == [
        "single_row", "padded_mixes", "partial_block"]
    sink = Case({}, {"x": torch.zeros(1, 1, 3, 3)})
    assert _classes("mhc.sinkhorn_bwd", sink, SinkhornConfig(4)) == ["single_row", "padded_matrix"]
    assert _classes("mhc.sinkhorn_bwd", Case({}, {"x": torch.zeros(2, 4, 4)}), SinkhornConfig(4)) == []


def test_head_and_fused_norm_classes():
    from kernels.mhc.fused_norm import MergeConfig, ReduceConfig
    from kernels.mhc.head_mix import HeadMixBwdConfig, HeadMixConfig

    mixes = Case({}, {"mixes": torch.zeros(1, 1, 3)})
    assert _classes("mhc.head_compute_mix", mixes, HeadMixConfig(False)) == ["single_row", "partial_block",
                                                                              "element_tail"]
    whole = Case({}, {"mixes": torch.zeros(4, 64, 4)})  # 1024 fp32: 256 vectors, one CTA; 256 tokens
    assert _classes("mhc.head_compute_mix", whole, HeadMixConfig(True)) == []
    assert _classes("mhc.head_compute_mix_bwd", whole, HeadMixBwdConfig()) == []
    assert _classes("mhc.head_compute_mix_bwd", mixes, HeadMixBwdConfig()) == ["single_row", "partial_block"]
    fn = Case({}, {"fn": torch.zeros(1, 6)})
    assert _classes("mhc.norm_fn", fn, MergeConfig(False)) == ["single_row", "partial_block", "k_tail"]
    assert _classes("mhc.norm_fn_bwd", Case({}, {"fn": torch.zeros(3, 512)}), MergeConfig(True)) == []
    assert _classes("mhc.norm_fn", Case({}, {"fn": torch.zeros(3, 520)}), MergeConfig(True)) == ["partial_block"]
    parts = Case({}, {"out_mul_splitted": torch.zeros(1, 1, 2, 24)})
    assert _classes("mhc.reduce_partials_and_rmsnorm", parts, ReduceConfig()) == ["single_row", "single_split",
                                                                                   "partial_block"]
    assert _classes("mhc.reduce_partials_and_rmsnorm_bwd", Case({}, {"out_mul_splitted": torch.zeros(2, 64, 2, 3)}),
                    ReduceConfig()) == []


def test_quant_norm_and_swiglu_classes():
    from kernels.quant.norm import ColumnConfig, RowConfig
    from kernels.quant.swiglu_plain import SwigluPlainConfig

    one = Case({}, {"x": torch.zeros(1, 100, dtype=torch.bfloat16)})
    assert _classes("quant.norm_fwd", one, RowConfig("bfloat16", False, False)) == ["single_row", "partial_block",
                                                                                     "hidden_tail"]
    # 1024 fp32: 256 vectors, two whole sweeps of 128 threads; 1028: a third, partial one
    assert _classes("quant.norm_bwd", Case({}, {"x": torch.zeros(2, 1024)}), RowConfig("float32", True, True)) == []
    assert _classes("quant.norm_bwd", Case({}, {"x": torch.zeros(2, 1028)}), RowConfig("float32", True, True)) == [
        "partial_block"]
    assert _classes("quant.norm_wgrad", Case({}, {"x": torch.zeros(512, 4096)}), ColumnConfig("float32", True)) == []
    assert _classes("quant.norm_wgrad", Case({}, {"x": torch.zeros(300, 4096)}), ColumnConfig("float32", True)) == [
        "partial_split"]
    bwd = SwigluPlainConfig("bwd", "float32", "float32", "float32", 1)
    swiglu = Case({}, {"x": torch.zeros(1, 20), "pos_to_token_topk": torch.zeros(1, dtype=torch.int32)})
    assert _classes("quant.swiglu_plain", swiglu, bwd) == ["single_row", "hidden_tail", "routed"]
    plain = Case({}, {"x": torch.zeros(2, 32), "pos_to_token_topk": None})
    assert _classes("quant.swiglu_plain", plain, bwd._replace(vec=8)) == []


def test_routing_and_engram_classes():
    from kernels.engram.fused_weight import FusedWeightConfig
    from kernels.engram.hash import HashConfig
    from kernels.moe.groups import GroupsConfig

    assert _classes("moe.topk_sum_and_topk_group_idx", Case({}, {"scores": torch.zeros(1, 8, 4)}),
                    GroupsConfig()) == ["single_row"]
    assert _classes("moe.aux_fi", Case({}, {"topk_idx": torch.zeros(3, 2)}), GroupsConfig()) == []
    ids = torch.zeros(1, 3, dtype=torch.int64)
    hashed = Case({}, {"ngram_token_ids": ids, "vocab_sizes": torch.zeros(2, 2, 3), "image_token_mask": None})
    assert _classes("engram.hash", hashed, HashConfig()) == ["single_row", "partial_block"]
    whole = Case({}, {"ngram_token_ids": torch.zeros(32, 3), "vocab_sizes": torch.zeros(2, 2, 2),
                      "image_token_mask": torch.zeros(32, dtype=torch.bool)})
    assert _classes("engram.hash", whole, HashConfig()) == ["image_tokens"]  # 256 elements: one whole CTA
    weights = Case({}, {"weight_hidden": torch.zeros(4, 512)})  # 2048 = 256 vectors of 8
    assert _classes("engram.fused_weight", weights, FusedWeightConfig(True)) == []
    assert _classes("engram.fused_weight", weights, FusedWeightConfig(False)) == []
    assert _classes("engram.fused_weight", Case({}, {"weight_hidden": torch.zeros(4, 7)}),
                    FusedWeightConfig(False)) == ["partial_block"]
