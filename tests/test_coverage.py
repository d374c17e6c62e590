"""Kernel-path coverage (tkverify.coverage): the launch recorder, the labels of an example, the table and
coverage.json of a report, and the committed coverage list's gaps (TKVERIFY_COVERAGE=<coverage.json>)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from kernels import _tilelang
from kernels.transpose import BATCHED_TRANSPOSE, TransposeConfig
from tkverify import coverage, registry
from tkverify.case import Case
from tkverify.report import SpeedRow
from tkverify.report.reach import coverage_markdown, read_coverage

SHIPPED = TransposeConfig("int32", True)


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
    shipped = {"transpose.batched_transpose": [SHIPPED, TransposeConfig("int32", False)]}
    listed = coverage.coverage_list({(row.op, row.impl): row.coverage}, shipped)
    entry = listed["transpose.batched_transpose"][repr(SHIPPED)]
    assert entry["examples"] == 3 and entry["classes"] == {"single_row": 0, "partial_tile_m": 0, "partial_tile_n": 2}
    assert coverage.gaps(listed) == [
        f"transpose.batched_transpose {SHIPPED!r}: never with single_row",
        f"transpose.batched_transpose {SHIPPED!r}: never with partial_tile_m",
        f"transpose.batched_transpose {TransposeConfig('int32', False)!r}: never launched"]
    text = "\n".join(coverage_markdown([row], shipped))
    assert "**gap**" in text and "partial_tile_n 2" in text and "3 gaps" in text


def test_candidates_are_exempt():
    shipped = coverage.shipped_configs()
    for name, kernel in _tilelang.kernel_defs().items():
        assert not set(kernel.candidates) & set(shipped[name])


def test_every_boundary_table_entry_names_a_kernel():
    assert set(coverage.BOUNDARY) <= set(_tilelang.kernel_defs())


@pytest.mark.skipif(not os.environ.get("TKVERIFY_COVERAGE"), reason="TKVERIFY_COVERAGE=<a report's coverage.json> "
                    "checks a committed coverage list")
def test_committed_coverage_list_has_no_gap():
    missing = coverage.gaps(read_coverage(Path(os.environ["TKVERIFY_COVERAGE"])))
    assert not missing, "\n".join(missing)
