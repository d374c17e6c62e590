"""Layouts as a drawn dimension: the same values of a case's tensor inputs in another memory layout.

An implementation declares which layouts it accepts per input (`tkverify.registry.Impl.layouts`);
`with_layouts` wraps an op's case strategy so that each such input is redrawn among them, values
unchanged:

* ``contiguous``  - as the op's strategy drew it;
* ``row_strided`` - a slice ``buf[..., :n]`` of a wider buffer (the last dimension contiguous, the
  row stride larger: padding of 16 bytes, of a whole row as tile-kernels' own tests use, or of one
  element, which leaves the rows unaligned);
* ``batch_slice`` - the slice ``buf[1:1+B]`` of a batch one larger on each side (contiguous, at a
  storage offset of one batch entry).

The padding and the batch entries around the slice hold `tkverify.case.SENTINEL_BYTE` (NaN in every
floating format), so an implementation that reads past a row shows it.  Each drawn layout is tagged
with ``hypothesis.event("layout: <input>=<class>")``; `case_layouts` names the classes of a case.
"""

from __future__ import annotations

import dataclasses
from typing import Mapping, Sequence

import hypothesis
import torch
from hypothesis import strategies as st
from hypothesis.strategies import SearchStrategy

from tkverify.case import Case, dense_strides, is_plain, strided_view

CONTIGUOUS, ROW_STRIDED, BATCH_SLICE = "contiguous", "row_strided", "batch_slice"
LAYOUTS = (CONTIGUOUS, ROW_STRIDED, BATCH_SLICE)
OTHER = "other"  # a layout none of LAYOUTS describes (a transposed view, an expanded one)


def check_layouts(accepted: Mapping[str, Sequence[str]]) -> None:
    """Raise ValueError naming the input of a layout that is not one of `LAYOUTS`."""
    for name, classes in accepted.items():
        unknown = [c for c in classes if c not in LAYOUTS]
        if unknown:
            raise ValueError(f"layouts of {name!r}: {unknown} are not among {LAYOUTS}")


def layout_class(t: torch.Tensor) -> str:
    """Which of `LAYOUTS` `t`'s strides and storage offset are (`OTHER` where none is)."""
    if is_plain(t):
        return CONTIGUOUS
    if t.stride() == dense_strides(t.shape):
        return BATCH_SLICE
    if t.dim() >= 2 and t.stride(-1) == 1 and all(s >= t.shape[-1] for s in t.stride()[:-1]):
        return ROW_STRIDED
    return OTHER


def case_layouts(case: Case) -> dict[str, str]:
    """The layout class of each tensor input of `case`."""
    return {name: layout_class(t) for name, t in case.inputs.items()}


def applicable(t: torch.Tensor, classes: Sequence[str]) -> list[str]:
    """The classes of `classes` that `t` can take, contiguous first: a row stride needs rows (2 or more
    dimensions), a batch slice a leading dimension, and both an element (an empty tensor has no layout
    to speak of)."""
    some = t.numel() > 0
    can = {CONTIGUOUS: True, ROW_STRIDED: some and t.dim() >= 2, BATCH_SLICE: some and t.dim() >= 1}
    return [c for c in LAYOUTS if c in classes and can[c]]


def row_strided(t: torch.Tensor, pad: int) -> torch.Tensor:
    """`t`'s values in ``buf[..., :n]`` of a sentinel-filled buffer whose rows are `pad` elements longer."""
    wide = (*t.shape[:-1], t.shape[-1] + pad)
    return strided_view(t, dense_strides(wide), 0, wide[0] * dense_strides(wide)[0])


def batch_slice(t: torch.Tensor) -> torch.Tensor:
    """`t`'s values in ``buf[1:1+B]`` of a sentinel-filled batch of B + 2 entries."""
    entry = t[0].numel()
    return strided_view(t, dense_strides(t.shape), entry, (t.shape[0] + 2) * entry)


def paddings(t: torch.Tensor) -> list[int]:
    """The row paddings drawn, simplest first: 16 bytes (rows stay aligned where they were), a whole row
    (the layout tile-kernels' tests use), one element (rows unaligned)."""
    return list(dict.fromkeys((max(16 // t.element_size(), 1), max(t.shape[-1], 1), 1)))


@st.composite
def _relaid(draw, strategy: SearchStrategy[Case], accepted: dict[str, tuple[str, ...]]) -> Case:
    case = draw(strategy)
    inputs = dict(case.inputs)
    for name in sorted(accepted):
        t = inputs.get(name)
        if not isinstance(t, torch.Tensor):
            continue
        if not is_plain(t):  # drawn in a layout of its own by the op's strategy: kept as drawn
            hypothesis.event(f"layout: {name}={layout_class(t)}")
            continue
        layout = draw(st.sampled_from(applicable(t, accepted[name])))
        hypothesis.event(f"layout: {name}={layout}")
        if layout == ROW_STRIDED:
            inputs[name] = row_strided(t, draw(st.sampled_from(paddings(t))))
        elif layout == BATCH_SLICE:
            inputs[name] = batch_slice(t)
    return dataclasses.replace(case, inputs=inputs)


def with_layouts(strategy: SearchStrategy[Case], accepted: Mapping[str, Sequence[str]]) -> SearchStrategy[Case]:
    """`strategy` with each input named in `accepted` redrawn among the layouts listed for it (values
    unchanged); `strategy` itself where no input accepts more than the contiguous layout."""
    check_layouts(accepted)
    wanted = {name: tuple(classes) for name, classes in accepted.items() if set(classes) - {CONTIGUOUS}}
    if not wanted:
        return strategy
    return _relaid(strategy, wanted)


def layout_labels(case: Case, accepted: Mapping[str, Sequence[str]]) -> list[str]:
    """``"<input>=<class>"`` for each input of `case` that `accepted` draws in more than the contiguous
    layout: what the report counts per (op, impl)."""
    drawn = [name for name, classes in accepted.items() if set(classes) - {CONTIGUOUS}]
    return [f"{name}={layout_class(case.inputs[name])}" for name in sorted(drawn)
            if isinstance(case.inputs.get(name), torch.Tensor)]
