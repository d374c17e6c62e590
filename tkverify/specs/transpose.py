"""Transposes: pure data movement, judged bitwise (NaN payloads and -0 included)."""

import references.transpose
import strategies.transpose
from tkverify.policies import bitwise
from tkverify.registry import OpSpec, register, tilelang_impl, torch_impl

for name, doc in (("transpose", "out[j, i] = x[i, j]"), ("batched_transpose", "out[b, j, i] = x[b, i, j]")):
    register(OpSpec(
        name=f"transpose.{name}",
        oracle=getattr(references.transpose, name),
        strategy=getattr(strategies.transpose, f"{name}_cases"),
        outputs={"out": bitwise()},
        impls={
            "torch": torch_impl(f"kernels.torch.transpose:{name}"),
            "tilelang": tilelang_impl(f"kernels.transpose:{name}"),
        },
        doc=doc,
    ))
