"""Transposes: pure data movement, judged bitwise (NaN payloads and -0 included); the
contract is docs/contract/transpose.md.

Input classes (the differential suite tags each judged case ``class: <name>`` per class it is in,
computed from its tensors by `strategies.quant.case_classes`; ``<class>:<input>`` names the input; the
report counts them and tests/test_classes.py fails where one has no example under the ci profile):

* transpose.batched_transpose: ``dtype_max:x``, ``empty``, ``nan:x``, ``nan_payload:x``, ``neg_inf:x``,
  ``neg_zero:x``, ``non_pow2``, ``pos_inf:x``, ``signed_zero_tie:x``, ``single_row``, ``subnormal:x``.
* transpose.transpose: ``dtype_max:x``, ``empty``, ``nan:x``, ``nan_payload:x``, ``neg_inf:x``,
  ``neg_zero:x``, ``non_pow2``, ``pos_inf:x``, ``signed_zero_tie:x``, ``subnormal:x``.
"""

import torch

import references.transpose
import strategies.transpose
from strategies.layouts import LAYOUTS
from tkverify import benchshapes
from tkverify.registry import BenchShape, OpSpec, register, tilelang_impl, torch_impl
from tkverify.policies import bitwise


def _transpose_shape(rows: int, cols: int, dtype: torch.dtype) -> BenchShape:
    # x read once and out written once; odd sizes are the tail tiles' cost
    name = f"{rows}x{cols} {str(dtype).removeprefix('torch.').replace('float8_e4m3fn', 'e4m3')}"
    return BenchShape(name, lambda device: ({"x": benchshapes.randn((rows, cols), dtype, device)}, {}),
                      lambda i, p: 2 * benchshapes.nbytes(i["x"]))


BENCH = {
    "transpose.transpose": tuple(_transpose_shape(m, n, dtype)
                                 for dtype in (torch.float32, torch.bfloat16, torch.float8_e4m3fn)
                                 for m, n in ((8192, 8192), (8191, 8193))),
}

for name, doc in (("transpose", "out[j, i] = x[i, j]"), ("batched_transpose", "out[b, j, i] = x[b, i, j]")):
    register(OpSpec(
        name=f"transpose.{name}",
        oracle=getattr(references.transpose, name),
        strategy=getattr(strategies.transpose, f"{name}_cases"),
        outputs={"out": bitwise()},
        impls={
            # The eager transposes take x at any row (and batch) stride; the TileLang kernel reads dense rows.
            "torch": torch_impl(f"kernels.torch.transpose:{name}", layouts={"x": LAYOUTS}),
            "tilelang": tilelang_impl(f"kernels.transpose:{name}"),
        },
        doc=doc,
        bench=BENCH.get(f"transpose.{name}", ()),
    ))
