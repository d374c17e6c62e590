"""How a user puts their own code under tkverify: one declaration each.

    tkverify report --load examples.my_kernel --impl mine --out my-report

1. A new implementation of a registered op (`moe.topk_gate`), here built on
   `torch.topk`.  tkverify finds that `torch.topk` breaks ties arbitrarily,
   where the contract says ties go to the lower index, names the element and
   saves the case.
2. A whole new op with its own float64 oracle, strategy and policy.

An implementation that cannot run a case (an option, format or size its library
lacks) raises ``tkverify.Unsupported("why")``: the case is counted under that
reason in the report and never judged.  Everything used here is in
``tkverify.__all__``.
"""

import numpy as np
import torch
from hypothesis import strategies as st

import tkverify
from tkverify import Case, Impl, OpSpec


def my_topk(scores: torch.Tensor, k: int) -> torch.Tensor:
    return torch.topk(scores, k, dim=1, largest=True, sorted=True).indices


tkverify.register_impl("moe.topk_gate", Impl("mine", my_topk, device="auto"))


def softplus_oracle(x: torch.Tensor) -> np.ndarray:
    """log(1 + e^x) in float64, from the definition (log1p for accuracy)."""
    v = x.double().numpy()
    return np.where(v > 30, v + np.log1p(np.exp(-v)), np.log1p(np.exp(np.minimum(v, 30))))


def softplus_cases():
    values = st.lists(st.floats(-50, 50, width=32), min_size=0, max_size=300)
    return values.map(lambda v: Case({}, {"x": torch.tensor(v, dtype=torch.float32)}))


def softplus_fp32(x: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.softplus(x)


tkverify.register(OpSpec(
    name="example.softplus",
    oracle=softplus_oracle,
    strategy=softplus_cases,
    outputs={"y": tkverify.ulp("fp32", max=4)},
    impls={"mine": Impl("mine", softplus_fp32, device="auto")},
    doc="softplus(x) = log(1 + exp(x)), fp32 in and out",
))
