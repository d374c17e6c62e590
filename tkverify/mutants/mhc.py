"""Mutants of the mHC Sinkhorn normalisation (OPS.md "mhc": ``sinkhorn(x, repeat=10, eps=1e-6)``).

Declared before the mhc family exists, so that the catalogue says what is
still to be checked: until "mhc.sinkhorn" is registered they are reported as
"not applicable (op not registered)" and do not count.  "One iteration fewer"
is a model of the contract (the implementation called with repeat - 1) and
works for every implementation as soon as the op is registered.  The other
two need the eager code's steps (kernels/torch/mhc.py, not written yet): their
factories are to be added with it, as a parametrised copy of the normalisation
step (rows and columns swapped) and of the backward's reverse sweep (one step
left out).  Until then they are reported as not applicable, with that note.
"""

from __future__ import annotations

from typing import Any, Callable

from tkverify.mutants import Mutant

DEFAULT_REPEAT = 10  # OPS.md


def one_iteration_fewer(sinkhorn: Callable[..., Any]) -> Callable[..., Any]:
    """The implementation called with repeat - 1 (at least 1): one row + column sweep fewer.

    With repeat = 1 there is no sweep to leave out and the mutant equals the op.
    """

    def broken(*args: Any, **kwargs: Any) -> Any:
        if len(args) >= 2:
            args = (args[0], max(int(args[1]) - 1, 1), *args[2:])
        else:
            kwargs["repeat"] = max(int(kwargs.get("repeat", DEFAULT_REPEAT)) - 1, 1)
        return sinkhorn(*args, **kwargs)

    return broken


_TO_WRITE = "to be written with kernels/torch/mhc.py (a parametrised copy of the step it breaks)"

MUTANTS = [
    Mutant("sinkhorn_one_iteration_fewer", "mhc.sinkhorn",
           "Sinkhorn runs repeat - 2 row/column sweeps after the first column normalisation, not repeat - 1",
           model=one_iteration_fewer),
    Mutant("sinkhorn_rows_columns_swapped", "mhc.sinkhorn",
           "the row and the column normalisations are swapped", note=_TO_WRITE),
    Mutant("sinkhorn_backward_missing_step", "mhc.sinkhorn",
           "the Sinkhorn backward leaves out one step of the reverse sweep", backward=True, note=_TO_WRITE),
]
