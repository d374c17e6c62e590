"""Transposes: pure data movement, judged bitwise (NaN payloads and -0 included); the
contract is docs/contract/transpose.md.

Input classes (the differential suite tags each judged case ``class: <name>`` per class it is in,
computed from its tensors by `strategies.classes.case_classes`; ``<class>:<input>`` names the input; the
report counts them and tests/test_classes.py fails where one has no example under the ci profile):

* transpose.batched_transpose: ``dtype_max:x``, ``empty``, ``nan:x``, ``nan_payload:x``, ``neg_inf:x``,
  ``neg_zero:x``, ``non_pow2``, ``pos_inf:x``, ``signed_zero_tie:x``, ``single_row``, ``subnormal:x``.
* transpose.transpose: ``dtype_max:x``, ``empty``, ``nan:x``, ``nan_payload:x``, ``neg_inf:x``,
  ``neg_zero:x``, ``non_pow2``, ``pos_inf:x``, ``signed_zero_tie:x``, ``subnormal:x``.
"""

import dataclasses

import torch

import references.transpose
import strategies.transpose
from strategies.layouts import LAYOUTS
from tkverify import benchshapes
from tkverify.registry import BenchShape, OpSpec, register, tilelang_impl, torch_impl
from tkverify.policies import bitwise


ROW_PADDING = 128  # elements past each row of the strided x's wider buffer


def _transpose_shape(rows: int, cols: int, dtype: torch.dtype, padding: int = 0) -> BenchShape:
    """x (rows, cols); with `padding`, x = buf[:, :cols] of a buffer whose rows are `padding` longer (read in
    place at that row stride).  x read once and out written once (the padding is never read); odd sizes
    are the tail tiles' cost."""
    name = f"{rows}x{cols} {str(dtype).removeprefix('torch.').replace('float8_e4m3fn', 'e4m3')}"
    if padding:
        name += f" row stride N+{padding}"
    return BenchShape(name, lambda device: ({"x": benchshapes.randn((rows, cols + padding), dtype, device)[:, :cols]},
                                            {}),
                      lambda i, p: 2 * benchshapes.nbytes(i["x"]))


BENCH = {
    "transpose.transpose": tuple(_transpose_shape(m, n, dtype)
                                 for dtype in (torch.float32, torch.bfloat16, torch.float8_e4m3fn)
                                 for m, n in ((8192, 8192), (8191, 8193)))
    + tuple(_transpose_shape(8192, 8192, dtype, ROW_PADDING)
            for dtype in (torch.float32, torch.bfloat16, torch.float8_e4m3fn)),
}

for name, doc in (("transpose", "out[j, i] = x[i, j]"), ("batched_transpose", "out[b, j, i] = x[b, i, j]")):
    register(OpSpec(
        name=f"transpose.{name}",
        oracle=getattr(references.transpose, name),
        strategy=getattr(strategies.transpose, f"{name}_cases"),
        outputs={"out": bitwise()},
        impls={
            # Both take x at any row (and batch) stride; the TileLang kernel reads it in place at its strides.
            "torch": torch_impl(f"kernels.torch.transpose:{name}", layouts={"x": LAYOUTS}),
            "tilelang": dataclasses.replace(tilelang_impl(f"kernels.transpose:{name}"), layouts={"x": LAYOUTS}),
        },
        doc=doc,
        bench=BENCH.get(f"transpose.{name}", ()),
    ))
