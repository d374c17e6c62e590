"""A toy op for tests/test_claims.py, loaded with ``--tk-load claims_toy``: y = 2x in fp32 (exact), held to
2 ULP.  Its implementation "toy" is exact, or one ULP off where TOY_SLOPPY=1: still inside the contract."""

import os

import numpy as np
import torch
from hypothesis import strategies as st

import tkverify
from tkverify import Case, Impl, OpSpec


def double_oracle(x: torch.Tensor) -> np.ndarray:
    return 2.0 * x.double().numpy()


def double_cases():
    values = st.lists(st.floats(-2.0**100, 2.0**100, width=32), min_size=1, max_size=64)
    return values.map(lambda v: Case({}, {"x": torch.tensor(v, dtype=torch.float32)}))


def double_fp32(x: torch.Tensor) -> torch.Tensor:
    y = 2.0 * x
    if os.environ.get("TOY_SLOPPY") == "1":
        y = torch.nextafter(y, torch.full_like(y, float("inf")))
    return y


tkverify.register(OpSpec(
    name="toy.double",
    oracle=double_oracle,
    strategy=double_cases,
    outputs={"y": tkverify.ulp("fp32", max=2)},
    impls={"toy": Impl("toy", double_fp32, device="cpu")},
    doc="y = 2x, fp32",
))
