"""How a bad-argument table is written, for tests/test_bad_inputs.py and the table modules beside it
(tests/bad_inputs_mhc.py, tests/bad_inputs_quant.py): a `Table` of a function's valid call and its spoiled
variants (`Bad`), the editors that spoil one argument, and the pieces the casts' tables share."""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable

import torch

# -- how a table is written -----------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Bad:
    """One spoiled argument: `change(args, foreign)` edits the valid call's arguments in place."""

    id: str
    arg: str  # the argument the error must name first
    error: type[Exception]
    change: Callable[[dict[str, Any], torch.device], None]


@dataclasses.dataclass(frozen=True)
class Table:
    """A function's valid call and its spoiled variants.

    base        ``base() -> {argument: value}``, a valid call on the CPU (tensors are
                moved to the device under test).
    tensors     tensor argument -> a dtype it must refuse; each such argument also gets
                a non-tensor, (unless in `any_rank`) an extra dimension, (unless in
                `any_strides`) a non-contiguous view; every one but `reference` a tensor on another device.
    reference   the tensor whose device is the call's device (named by a TileLang
                wrapper given CPU tensors).
    ints        integer parameter -> out-of-range values; each also gets a bool and a float.
    floats      float parameter -> out-of-range values; each also gets a str and a bool.
    bools       flags: each gets the int 1.
    extra       the function's own spoiled calls (shapes that disagree, option combinations).
    positional  call positionally in this order (autograd Function.apply takes no keywords).
    """

    base: Callable[[], dict[str, Any]]
    tensors: dict[str, torch.dtype]
    reference: str
    ints: dict[str, tuple[Any, ...]] = dataclasses.field(default_factory=dict)
    floats: dict[str, tuple[Any, ...]] = dataclasses.field(default_factory=dict)
    bools: tuple[str, ...] = ()
    any_strides: tuple[str, ...] = ()
    any_rank: tuple[str, ...] = ()
    extra: tuple[Bad, ...] = ()
    positional: tuple[str, ...] | None = None

    def bads(self) -> list[Bad]:
        out = []
        for name, dtype in self.tensors.items():
            out += [
                Bad(f"{name}-not-a-tensor", name, TypeError, _set(name, lambda t: t.tolist())),
                Bad(f"{name}-dtype-{str(dtype).removeprefix('torch.')}", name, TypeError,
                    _set(name, lambda t, d=dtype: t.to(d))),
            ]
            if name not in self.any_rank:
                out.append(Bad(f"{name}-extra-dim", name, ValueError, _set(name, lambda t: t.unsqueeze(0))))
            if name not in self.any_strides:
                out.append(Bad(f"{name}-non-contiguous", name, ValueError, _set(name, _strided)))
            if name != self.reference:
                out.append(Bad(f"{name}-other-device", name, ValueError,
                               lambda a, foreign, n=name: a.update({n: a[n].to(foreign)})))
        for name, values in self.ints.items():
            out += [Bad(f"{name}-bool", name, TypeError, _put(name, True)),
                    Bad(f"{name}-float", name, TypeError, _put(name, 2.0))]
            out += [Bad(f"{name}={v}", name, ValueError, _put(name, v)) for v in values]
        for name, values in self.floats.items():
            out += [Bad(f"{name}-str", name, TypeError, _put(name, "1e-6")),
                    Bad(f"{name}-bool", name, TypeError, _put(name, True))]
            out += [Bad(f"{name}={v}", name, ValueError, _put(name, v)) for v in values]
        out += [Bad(f"{name}-int", name, TypeError, _put(name, 1)) for name in self.bools]
        return out + list(self.extra)


def _set(name: str, f: Callable[[torch.Tensor], Any]):
    return lambda args, foreign: args.update({name: f(args[name])})


def _put(name: str, value: Any):
    return _with(**{name: value})


def _with(**values: Any):
    """Replace arguments with the given values, tensors placed on the device of the call's other tensors
    (a CUDA call's spoilt argument must not also be on another device, which a check may name first)."""
    def change(args: dict[str, Any], foreign: torch.device) -> None:
        device = next((v.device for v in args.values() if isinstance(v, torch.Tensor)), None)
        args.update({k: v.to(device) if isinstance(v, torch.Tensor) and device is not None else v
                     for k, v in values.items()})
    return change


def _strided(t: torch.Tensor) -> torch.Tensor:
    """The same values in a view that is not contiguous (every other element of a wider tensor)."""
    wide = torch.zeros((*t.shape[:-1], 2 * t.shape[-1]), dtype=t.dtype, device=t.device)
    view = wide[..., ::2]
    view.copy_(t)
    assert not view.is_contiguous()
    return view


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


NON_FINITE_OR_NOT_POSITIVE = (math.nan, math.inf, 0.0, -1.0)


# -- shared by the casts' tables -------------------------------------------------------------------


def _x(rows: int, cols: int, dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    return torch.randn(rows, cols, generator=_gen(rows * 1000 + cols)).to(dtype)


SF_OPTIONS = ("round_sf", "use_ue8m0", "use_packed_ue8m0", "use_tma_aligned_col_major_sf")
CLAMP_MIN_BAD = (math.nan, math.inf, 0.0, -1.0, 1e-40)
OPTION_COMBINATIONS = (
    Bad("ue8m0-without-round_sf", "use_ue8m0", ValueError, _with(use_ue8m0=True)),
    Bad("packed-without-ue8m0", "use_packed_ue8m0", ValueError, _with(round_sf=True, use_packed_ue8m0=True)),
)
FMT_BAD = (
    Bad("fmt-not-a-str", "fmt", TypeError, _put("fmt", 1)),
    Bad("fmt-e5m2", "fmt", ValueError, _put("fmt", "e5m2")),
)



# The SwiGLU tables' pos_to_token_topk: for each of 8 expanded rows, its token * 2 + slot among 4 tokens of 2
# slots each (-1: a padding row); and the ways to spoil that routing.
SWIGLU_POS = torch.tensor([0, 3, -1, 5, 1, 7, 2, 6], dtype=torch.int32)
SWIGLU_ROUTING_BAD = (
    Bad("weights-without-pos", "topk_weights", ValueError, _put("pos_to_token_topk", None)),
    Bad("pos-other-length", "pos_to_token_topk", ValueError, _set("pos_to_token_topk", lambda t: t[:7])),
    Bad("pos-past-the-slots", "pos_to_token_topk", ValueError,
        _set("pos_to_token_topk", lambda t: torch.where(t == 7, 8, t))),
    Bad("pos-below-minus-one", "pos_to_token_topk", ValueError,
        _set("pos_to_token_topk", lambda t: torch.where(t == -1, -2, t))),
)
