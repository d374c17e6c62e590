"""Input classes: what each drawn case is, by the values and the shape of its tensors.

Each case a strategy draws is tagged with ``hypothesis.event("class: <name>")`` per input class it falls in,
computed from the drawn tensors (`case_classes`), so that a tag is true of the case; the report counts the
examples of each class, and tests/test_classes.py fails where a class a strategy lists (`tagging`) has
none under the ci profile.  Every family's strategies tag through these helpers; a family adds classes of
its own through `tagging`'s ``extra`` (the casts' saturation edges, `strategies.quant_classes.saturation_classes`).
"""

from __future__ import annotations

import zlib
from collections.abc import Callable

import numpy as np
import torch
from hypothesis.strategies import SearchStrategy

from tkverify.case import Case

# The canonical quiet NaN of each floating dtype (sign clear); any other NaN bit pattern is a payload.
_CANONICAL_NAN = {torch.float32: 0x7FC00000, torch.bfloat16: 0x7FC0, torch.float16: 0x7E00,
                  torch.float8_e4m3fn: 0x7F, torch.float8_e5m2: 0x7E}
INT_OF_WIDTH = {1: torch.uint8, 2: torch.int16, 4: torch.int32}


def float_bits(t: torch.Tensor) -> torch.Tensor:
    """The bit patterns of a floating tensor, as non-negative int64."""
    bits = t.contiguous().view(INT_OF_WIDTH[t.element_size()]).long()
    return bits & ((1 << (8 * t.element_size())) - 1)


def tensor_classes(name: str, t: torch.Tensor) -> set[str]:
    """The value classes of one floating input, each as ``<class>:<name>``: NaN (and a NaN payload other
    than the canonical quiet NaN), +-inf, -0.0, subnormals, the dtype's largest finite magnitude, an
    all-zero row, and a row holding both -0.0 and +0.0 (a tie between the two zeros)."""
    if not t.is_floating_point() or t.numel() == 0:
        return set()
    found = set()
    x = t.float() if t.element_size() == 1 else t
    nan = torch.isnan(x)
    if nan.any():
        found.add("nan")
        canonical = _CANONICAL_NAN.get(t.dtype)
        if canonical is not None and bool((float_bits(t)[nan] != canonical).any()):
            found.add("nan_payload")
    if bool((x == float("inf")).any()):
        found.add("pos_inf")
    if bool((x == float("-inf")).any()):
        found.add("neg_inf")
    zero = x == 0
    negative_zero = zero & torch.signbit(x)
    if negative_zero.any():
        found.add("neg_zero")
    finite = torch.isfinite(x)
    tiny = torch.finfo(t.dtype).tiny
    if bool((finite & ~zero & (x.abs() < tiny)).any()):
        found.add("subnormal")
    if bool((finite & (x.abs() == torch.finfo(t.dtype).max)).any()):
        found.add("dtype_max")
    if t.dim() >= 1 and t.shape[-1] > 0:
        rows_zero, rows_negative = zero.reshape(-1, t.shape[-1]), negative_zero.reshape(-1, t.shape[-1])
        if bool(rows_zero.all(dim=1).any()):
            found.add("zero_row")
        if bool((rows_negative.any(dim=1) & (rows_zero & ~rows_negative).any(dim=1)).any()):
            found.add("signed_zero_tie")
    return {f"{c}:{name}" for c in found}


def shape_classes(case: Case, main: str) -> set[str]:
    """The shape classes of a case: an empty input, a single row of the main input (one row before its
    last dimension), a main input whose last dimension is not a power of two."""
    found = set()
    if any(t.numel() == 0 for t in case.inputs.values() if isinstance(t, torch.Tensor)):
        found.add("empty")
    t = case.inputs[main]
    if t.dim() >= 2 and t.numel() // max(t.shape[-1], 1) == 1 and t.shape[-1] > 0:
        found.add("single_row")
    if t.dim() >= 1 and t.shape[-1] > 0 and t.shape[-1] & (t.shape[-1] - 1):
        found.add("non_pow2")
    return found


def case_classes(case: Case, main: str) -> set[str]:
    """Every input class of a case: its shape classes and each floating input's value classes."""
    found = shape_classes(case, main)
    for name, t in case.inputs.items():
        if isinstance(t, torch.Tensor):
            found |= tensor_classes(name, t)
    return found


def tag_classes(classes: list[str]) -> None:
    """Tag the running hypothesis example with ``hypothesis.event("class: <name>")`` per class."""
    import hypothesis

    for name in classes:
        hypothesis.event(f"class: {name}")


def tagging(main: str, classes: tuple[str, ...], extra: Callable[[Case], set[str]] | None = None):
    """Give a case strategy (the function) its input classes: ``classify(case)``, the sorted classes of a
    case it drew (`case_classes`, `main` its main input), and ``classes``, those it promises to reach under
    the ci profile (tests/test_classes.py checks them, the spec docstrings list them).  The strategy itself
    is returned unchanged, so the cases drawn stay the same; the differential suite tags each judged case
    (`tag_classes`) and the report counts the classes."""
    def wrap(strategy: Callable[..., SearchStrategy[Case]]) -> Callable[..., SearchStrategy[Case]]:
        strategy.classes = classes
        strategy.classify = lambda case: sorted(case_classes(case, main) | (extra(case) if extra else set()))
        return strategy
    return wrap


def in_turn(rng: np.random.Generator, shape: tuple[int, ...], fraction: float, count: int) -> np.ndarray:
    """For each entry of an array of `shape`: -1 where it is left alone, else which of `count` choices it
    takes.  About `fraction` of the entries, and at least min(size, count), are chosen at random places, and
    take the choices in turn from a random one on: an array of `count` or more entries holds every choice,
    so that each choice's class comes within few examples."""
    size = int(np.prod(shape))
    chosen = rng.permutation(size)[:max(round(fraction * size), min(size, count))]
    which = np.full(size, -1)
    which[chosen] = (np.arange(len(chosen)) + rng.integers(0, count)) % count
    return which.reshape(shape)


def draws_rng(draws: tuple, stream: int) -> np.random.Generator:
    """A generator seeded by every hypothesis draw of a case (a stable hash of their repr, `stream` telling
    apart the choices of one case; sets are given sorted), for a choice a strategy makes on top of its
    draws (which kernel configuration or dispatch corner the case is moved to), so that the draws stay as
    they are and shrink as before.  One drawn value alone would not do: the derandomised ci profile
    repeats and shrinks draws (the drawn seed is 0 in most of its examples), so that a choice taken from
    it lands on few values; a hash of all the draws spreads over the choices evenly."""
    return np.random.default_rng([zlib.crc32(repr(draws).encode()), stream])
