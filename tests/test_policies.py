"""The comparison policies: what passes, what fails, and what a failure says."""

import numpy as np
import pytest
import torch

from tkverify.policies import bitwise, codes, distance_histogram, relative, ulp


def test_bitwise_integers_pass_and_fail_naming_the_element():
    expected = np.arange(12, dtype=np.int64).reshape(3, 4)
    actual = torch.from_numpy(expected.copy())
    assert bitwise(torch.int64).compare("idx", actual, expected).passed
    actual[2, 1] = 17
    c = bitwise(torch.int64).compare("idx", actual, expected)
    assert not c.passed and c.count == 12 and c.exact == 11
    assert "worst at index (2, 1)" in c.message and "actual 17, expected 9" in c.message
    assert c.max_ulp == 8  # integers are their own codes


def test_bitwise_checks_dtype_and_shape():
    expected = np.zeros((2, 3), dtype=np.int64)
    assert not bitwise(torch.int64).compare("idx", torch.zeros(2, 3, dtype=torch.int32), expected).passed
    c = bitwise().compare("idx", torch.zeros(3, 2, dtype=torch.int64), expected)
    assert not c.passed and "shape" in c.message


def test_bitwise_float_against_exact_values_uses_correct_rounding():
    x = np.array([1.0, 1.0 + 2.0**-9, 3.0, -0.0])  # 1 + 2^-9 is a bf16 tie: rounds to even (1.0)
    rounded = torch.tensor([1.0, 1.0, 3.0, -0.0], dtype=torch.bfloat16)
    assert bitwise().compare("y", rounded, x).passed
    wrong = torch.tensor([1.0, 1.0078125, 3.0, -0.0], dtype=torch.bfloat16)  # rounded the tie up
    c = bitwise().compare("y", wrong, x)
    assert not c.passed and "index (1,)" in c.message
    signed_zero = torch.tensor([1.0, 1.0, 3.0, 0.0], dtype=torch.bfloat16)
    assert not bitwise().compare("y", signed_zero, x).passed  # ±0 count


def test_bitwise_tensor_expected_counts_nan_payloads():
    bits = torch.tensor([0x7FC00000, 0x7FC00001, -(2**31)], dtype=torch.int32)  # qNaN, qNaN with payload, -0.0
    a = bits.view(torch.float32)
    assert bitwise().compare("out", a, a.clone()).passed
    other = bits.clone()
    other[1] = 0x7FC00000
    assert not bitwise().compare("out", a, other.view(torch.float32)).passed


def test_ulp_policy_measures_against_exact_value():
    x = np.array([1.0 / 3.0, 2.0 / 3.0, 1e-3])
    correctly_rounded = torch.tensor(x, dtype=torch.float32)
    c = ulp(max=0.5).compare("y", correctly_rounded, x)
    assert c.passed and c.exact == 3 and c.max_ulp <= 0.5
    off = correctly_rounded.clone()
    off[2] = torch.nextafter(off[2], torch.tensor(1.0))
    c = ulp(max=0.5).compare("y", off, x)
    assert not c.passed and 0.5 < c.max_ulp <= 1.5 and c.hist == {"0": 2, "1": 1}
    assert "ULP error" in c.message and "index (2,)" in c.message
    assert ulp(max=1.5).compare("y", off, x).passed


def test_codes_policy_bounds_code_distance():
    x = np.array([1.0, 2.0, 448.0, 500.0])  # 500 saturates to 448 in e4m3
    q = torch.tensor([1.0, 2.0, 448.0, 448.0]).to(torch.float8_e4m3fn)
    assert codes("e4m3", 0).compare("q", q, x).passed
    q2 = torch.tensor([1.125, 2.0, 448.0, 448.0]).to(torch.float8_e4m3fn)  # one code above 1.0
    assert not codes("e4m3", 0).compare("q", q2, x).passed
    assert codes("e4m3", 1).compare("q", q2, x).passed


def test_relative_policy():
    x = np.array([1.0, 1000.0, -5.0])
    a = torch.tensor([1.0001, 1000.0, -5.0], dtype=torch.float32)
    assert relative(1e-3).compare("y", a, x).passed
    c = relative(1e-5).compare("y", a, x)
    assert not c.passed and "relative error" in c.message and "index (0,)" in c.message


def test_nan_must_stay_nan():
    x = np.array([np.nan, 1.0])
    assert ulp(max=0.5).compare("y", torch.tensor([np.nan, 1.0]), x).passed
    c = ulp(max=0.5).compare("y", torch.tensor([0.0, 1.0]), x)
    assert not c.passed and c.max_ulp == np.inf


def test_histogram_buckets():
    h = distance_histogram(np.array([0, 0, 1, 2, 3, 5, 9, 300]))
    assert h == {"0": 2, "1": 1, "2": 1, "3": 1, "4-7": 1, "8-15": 1, "256+": 1}
