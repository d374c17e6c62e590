"""The comparison policies: what passes, what fails, and what a failure says."""

import dataclasses
import math

import numpy as np
import pytest
import torch

from tkverify import formats
from tkverify.policies import Outcome, bitwise, codes, distance_histogram, relative, summarise, ulp


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


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.float8_e4m3fn])
@pytest.mark.parametrize("shape", [(0,), (), (5,), (3, 4), (2, 3, 4)])
def test_bitwise_identical_outputs_take_the_unmeasured_path_to_the_same_comparison(dtype, shape):
    """Identical codes skip the per-element measurement (`identical`); the Comparison is the one the
    measured path folds from an all-zero outcome, -0.0 and a NaN payload included."""
    x = torch.randn(shape).to(dtype) if shape else torch.tensor(1.5).to(dtype)
    if x.numel() > 2:
        x.view(-1)[0], x.view(-1)[1] = -0.0, float("nan")
    fmt = formats.of_dtype(dtype)
    a = formats.codes_of(x).astype(np.int64)
    zero, same = np.zeros(a.shape), np.ones(a.shape, bool)
    measured = summarise(Outcome("o", fmt.name, "bitwise", "bitwise", zero, zero.astype(np.int64), same, same,
                                 fmt.decode(a), fmt.decode(a), a, a, share=zero))
    assert dataclasses.asdict(bitwise().compare("o", x, x.clone())) == dataclasses.asdict(measured)


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


def test_every_policy_words_a_failure_the_same_way():
    """One format for every policy (`policies.failure_message`), the README's: how many elements fail,
    then the worst with its value, the expected value, both codes and its ULP error; a policy with a
    range per element adds it at the end.  An output rejected whole names what is wrong with it."""
    from tkverify.policies import Bracket, ErrorBound, summation, within

    c = bitwise(torch.int64).compare("indices", torch.tensor([[5]]), np.array([[0]]))
    assert c.message == ("output 'indices' (int64, bitwise): 1 of 1 elements (100%) fail\n"
                         "  worst at index (0, 0): actual 5, expected 0 (codes 0x5 vs 0x0), ULP error 5")
    x = np.array([1.0, 2.0, 3.0, 4.0])
    a = torch.tensor([1.0, 2.0, 3.0, 4.0 + 2.0**-21])  # one fp32 ULP above 4
    worst = ("1 of 4 elements (25%) fail\n  worst at index (3,): actual 4.00000048, expected 4 "
             "(codes 0x40800001 vs 0x40800000), ULP error 1")
    for policy, expected, bound, detail in (
            (bitwise(), x, "bitwise", ""),
            (ulp(max=0.5), x, "ULP error <= 0.5", ""),
            (codes("fp32", 0), x, "code distance <= 0", ""),
            (relative(1e-9), x, "relative error <= 1e-09", "; relative error 1.1920929e-07 there"),
            (within("fp32"), Bracket(x, x, x), "within the allowed range", "; allowed [4, 4] there"),
            (summation(), ErrorBound(x, np.zeros(4), "fp32"), "|y - exact| <= summation bound",
             "; allowed +-0 (0 ULP) there")):
        assert policy.compare("y", a, expected).message == f"output 'y' (fp32, {bound}): {worst}{detail}", policy
    wrong_dtype = bitwise(torch.int64).compare("indices", torch.tensor([[5]], dtype=torch.int32), np.array([[0]]))
    assert wrong_dtype.message == "output 'indices': dtype torch.int32, expected torch.int64"
    assert ulp().compare("y", torch.zeros(3), np.zeros(2)).message == \
        "output 'y': shape (3,) differs from the expected (2,)"


def test_nan_must_stay_nan():
    x = np.array([np.nan, 1.0])
    assert ulp(max=0.5).compare("y", torch.tensor([np.nan, 1.0]), x).passed
    c = ulp(max=0.5).compare("y", torch.tensor([0.0, 1.0]), x)
    assert not c.passed and c.max_ulp == np.inf


def test_histogram_buckets():
    h = distance_histogram(np.array([0, 0, 1, 2, 3, 5, 9, 300]))
    assert h == {"0": 2, "1": 1, "2": 1, "3": 1, "4-7": 1, "8-15": 1, "256+": 1}


def test_within_policy_enforces_the_bracket_and_measures_against_the_exact_value():
    from tkverify.policies import Bracket, within

    exact = np.array([1.0625, 2.0, np.nan, 5.0, 0.3])
    low = np.array([1.0, 2.0, np.nan, 5.0, -np.inf])  # element 0 may round either way
    high = np.array([1.125, 2.0, np.nan, 5.0, np.inf])  # element 4 is unconstrained, NaN included
    q = torch.tensor([1.125, 2.0, np.nan, 5.0, np.nan]).to(torch.float8_e4m3fn)
    c = within("e4m3").compare("q", q, Bracket(exact, low, high))
    assert c.passed and c.count == 5 and c.hist.get("1") == 1  # 1.125 is one code from the exact 1.0625's 1.0
    q2 = torch.tensor([1.125, 2.25, np.nan, 5.0, 0.0]).to(torch.float8_e4m3fn)
    c = within("e4m3").compare("q", q2, Bracket(exact, low, high))
    assert not c.passed and "index (1,)" in c.message and "allowed [2, 2]" in c.message
    q3 = torch.tensor([1.125, 2.0, 1.0, 5.0, 0.0]).to(torch.float8_e4m3fn)  # a NaN must stay NaN
    assert not within("e4m3").compare("q", q3, Bracket(exact, low, high)).passed
    # codes given as integers, and a shape mismatch
    codes = np.array([0x38, 0x40], dtype=np.uint8)  # e4m3 1.0, 2.0
    assert within("e4m3").compare("q", codes, Bracket(np.array([1.0, 2.0]), np.array([1.0, 2.0]),
                                                      np.array([1.0, 2.0]))).passed
    assert not within("e4m3").compare("q", codes[:1], Bracket(np.ones(2), np.ones(2), np.ones(2))).passed
    with pytest.raises(TypeError, match="Bracket"):
        within("e4m3").compare("q", codes, np.ones(2))


# -- summation: error bounds of working-precision sums ------------------------------------------


def _fp32_sum(terms: np.ndarray, order: np.ndarray) -> np.float32:
    """terms (float64, each an fp32 product) rounded to fp32 and added in fp32 in the given order."""
    acc = np.float32(0)
    for i in order:
        acc = np.float32(acc + np.float32(terms[i]))
    return acc


def test_gamma_and_summation_error():
    from tkverify.policies import FP32_UNIT_ROUNDOFF as u, gamma, summation_error

    assert gamma(0) == 0 and gamma(1) == u / (1 - u)
    np.testing.assert_array_equal(gamma(np.array([2, 3])), [2 * u / (1 - 2 * u), 3 * u / (1 - 3 * u)])
    with pytest.raises(ValueError, match="n \\* u < 1"):
        gamma(2**24)
    assert summation_error(5.0, 1, roundings_per_term=0) == 0  # one exact term: nothing to round
    assert summation_error(2.0, 3) == pytest.approx(2 * gamma(3))  # 2 additions + 1 product each
    assert summation_error(2.0, 3, roundings_per_term=2) == pytest.approx(2 * gamma(4))
    # Per-term input error compounds with the summation's; absolute errors pass through the additions.
    assert summation_error(1.0, 2, term_error=1e-3) == pytest.approx((1 + 1e-3) * (1 + gamma(2)) - 1)
    assert summation_error(0.0, 4, absolute=1e-40) == pytest.approx((1 + gamma(3)) * 1e-40)
    np.testing.assert_allclose(summation_error(np.array([1.0, 2.0]), np.array([1, 2]), roundings_per_term=0),
                               [0.0, 2 * gamma(1)])


def test_summation_bound_holds_for_every_order_where_terms_cancel():
    from tkverify.policies import ErrorBound, summation, summation_error

    rng = np.random.default_rng(7)
    for trial in range(200):
        n = int(rng.integers(1, 10))
        terms = rng.standard_normal(n) * np.exp2(rng.integers(-20, 20, size=n))
        if n >= 2 and trial % 2:  # two terms that cancel exactly, the rest tiny
            terms[1] = -terms[0]
            terms[2:] *= 2.0**-30
        terms = terms.astype(np.float32).astype(np.float64)  # the terms as fp32 products would be
        exact = np.array([math.fsum(terms)])
        bound = ErrorBound(exact, summation_error(np.abs(terms).sum(), n, roundings_per_term=0), "fp32")
        for order in (np.arange(n), np.arange(n)[::-1], rng.permutation(n)):
            y = torch.tensor([_fp32_sum(terms, order)])
            assert summation().compare("out", y, bound).passed, (terms, order)
    # Where terms cancel, the result is legitimately many ULPs from the exact sum.
    terms = np.array([2.0**25, 1.0, -(2.0**25)])
    y = torch.tensor([_fp32_sum(terms, np.arange(3))])  # 2^25 + 1 rounds to 2^25: the 1 is lost
    bound = ErrorBound(np.array([1.0]), summation_error(2.0**26 + 1, 3, roundings_per_term=0))
    c = summation().compare("out", y, bound)
    assert y.item() == 0.0 and c.passed and c.max_ulp == 2.0**23 and c.extra["max_bound_used"] <= 1


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # numpy's fp32 overflow, which is the point
def test_partial_sums_that_overflow_explain_an_infinity_or_a_nan_and_nothing_else():
    """The error bound assumes no partial sum overflows; `ErrorBound.reach` says when one may.
    Every order of an fp32 sum of terms near the overflow threshold (infinities among them) must
    pass, and what no order can give must still fail."""
    import itertools

    from tkverify.policies import ErrorBound, signed_reach, summation, summation_error

    big = 3.3895313892515355e38  # bf16's largest, as the CPU fuzz of mhc.post drew it
    rng = np.random.default_rng(11)
    pool = np.array([big, -big, big / 2, -big / 3, 1.4e37, -1.4e37, 1.0, np.inf, -np.inf])
    for _ in range(300):
        terms = rng.choice(pool, size=int(rng.integers(2, 5)))
        n = len(terms)
        exact = np.array([math.fsum(terms) if np.isfinite(terms).all() else np.sum(terms)])
        magnitude = np.abs(terms[np.isfinite(terms)]).sum()
        bound = ErrorBound(exact, np.array([summation_error(magnitude, n, roundings_per_term=0)]), "fp32",
                           signed_reach(terms[:, None], n, roundings_per_term=0))
        for order in itertools.permutations(range(n)):
            y = torch.tensor([_fp32_sum(terms, np.array(order))])
            assert summation().compare("out", y, bound).passed, (terms, order, y)

    def verdicts(terms, ys):
        terms = np.asarray(terms)
        bound = ErrorBound(np.array([np.sum(terms)]), np.array([0.0]), "fp32",
                           signed_reach(terms[:, None], len(terms), roundings_per_term=0))
        return [summation().compare("out", torch.tensor([y], dtype=torch.float32), bound).passed for y in ys]

    nan, inf = float("nan"), float("inf")
    # The fuzz case: -1.4e37 + -big reaches -inf before +inf is added: NaN, or +inf; never -inf.
    assert verdicts([-1.4e37, -big, inf], [inf, nan, -inf]) == [True, True, False]
    # Nothing on the negative side can overflow: only +inf.
    assert verdicts([-1.4e37, -1.0, inf], [inf, nan, -inf]) == [True, False, False]
    # Finite, exact 0: either side may overflow first; a finite result far off still fails.
    assert verdicts([big, big, -big, -big], [inf, -inf, nan, 0.0, 1e36]) == [True, True, True, True, False]
    # Finite, only the positive side can overflow: +inf, never -inf or NaN.
    assert verdicts([big, big, -big], [inf, -inf, nan]) == [True, False, False]
    # A term of three factors whose partial product overflows (w (q sf), q sf = 448 * 1e36): inf for a
    # tiny positive w, NaN for w = 0 (0 * inf); without its partial product, neither.  (The zero term
    # counts on both sides, so -inf passes there too: sound, not tight, in this corner.)
    for w, allowed in ((1e-30, [True, False, False]), (0.0, [True, True, True])):
        term, partial = np.array([[w * 448 * 1e36]]), np.array([[448 * 1e36]])
        bound = ErrorBound(term[0], np.array([0.0]), "fp32", signed_reach(term, 1, roundings_per_term=2,
                                                                             partial=partial))
        got = [summation().compare("out", torch.tensor([y], dtype=torch.float32), bound).passed
               for y in (inf, nan, -inf)]
        assert got == allowed, (w, got)
        plain = ErrorBound(term[0], np.array([0.0]), "fp32", signed_reach(term, 1, roundings_per_term=2))
        assert not summation().compare("out", torch.tensor([nan]), plain).passed
    # Without `reach` the policy keeps its old rule (an exact infinity must be that infinity).
    no_reach = ErrorBound(np.array([inf]), np.array([0.0]), "fp32")
    assert not summation().compare("out", torch.tensor([nan]), no_reach).passed


def test_summation_fails_past_the_bound_and_says_where():
    from tkverify.policies import ErrorBound, summation

    exact = np.array([1.0, 3.0, -2.0])
    bound = ErrorBound(exact, np.array([0.0, 2.0**-22, 0.0]), "fp32")
    within_bound = torch.tensor([1.0, 3.0 + 2.0**-22, -2.0])
    c = summation().compare("out", within_bound, bound)
    assert c.passed and c.extra["max_bound_used"] == 1.0 and c.extra["max_allowed_ulp"] == 1.0  # ulp(3) = 2^-22
    beyond = torch.tensor([1.0, 3.0 + 2.0**-21, -2.0])
    c = summation().compare("out", beyond, bound)
    assert not c.passed and "index (1,)" in c.message and "allowed +-" in c.message and "(1 ULP)" in c.message


def test_summation_adds_one_rounding_to_a_narrower_output():
    from tkverify import formats
    from tkverify.policies import ErrorBound, Summation, summation

    exact, error = np.array([1.0 + 2.0**-8]), np.array([2.0**-20])  # a bf16 tie, blurred by the sum's error
    assert Summation().allowance(formats.FP32, exact, error) == error  # fp32 holds the fp32 accumulator
    assert Summation().allowance(formats.BF16, exact, error) == error + 2.0**-8
    bound = ErrorBound(exact, error, "bf16")
    for y in (1.0, 1.0078125):  # either neighbour of the tie
        assert summation().compare("out", torch.tensor([y], dtype=torch.bfloat16), bound).passed
    assert not summation().compare("out", torch.tensor([1.015625], dtype=torch.bfloat16), bound).passed
    # The output must have the format the bound is for.
    c = summation().compare("out", torch.tensor([1.0]), bound)
    assert not c.passed and "dtype" in c.message


def test_summation_non_finite_and_shape():
    from tkverify.policies import ErrorBound, summation

    bound = ErrorBound(np.array([np.nan, np.inf, -np.inf, 1.0]), np.zeros(4), "fp32")
    assert summation().compare("out", torch.tensor([np.nan, np.inf, -np.inf, 1.0]), bound).passed
    assert not summation().compare("out", torch.tensor([0.0, np.inf, -np.inf, 1.0]), bound).passed
    assert not summation().compare("out", torch.tensor([np.nan, np.inf, np.inf, 1.0]), bound).passed
    assert not summation().compare("out", torch.tensor([np.nan, np.inf, -np.inf, np.nan]), bound).passed
    assert not summation().compare("out", torch.zeros(3), bound).passed
    with pytest.raises(TypeError, match="ErrorBound"):
        summation().compare("out", torch.zeros(4), np.zeros(4))


def test_summation_lets_a_sum_past_the_overflow_threshold_round_to_infinity():
    """Found by a 300-example fuzz run of mhc.post (tests/regressions/mhc.post-bf16-overflow-to-inf):
    a finite exact sum beyond bf16's overflow threshold correctly rounds to -inf."""
    from tkverify.policies import ErrorBound, summation

    bf16_max = 3.3895313892515355e38
    half_ulp = 2.0**119  # half of bf16's ULP at its largest binade: the threshold is bf16_max + 2^119
    exact = np.array([-3.51273687e38, -(bf16_max + half_ulp) + 2.0**110, 1e38])
    bound = ErrorBound(exact, np.array([0.0, 2.0**111, 0.0]), "bf16")
    rounded = torch.tensor([-math.inf, -math.inf, 1e38], dtype=torch.bfloat16)
    # 0: past the threshold; 1: below it by 2^110 but within its error bound of it; 2: ordinary.
    assert summation().compare("out", rounded, bound).passed
    finite_max = torch.tensor([-bf16_max, -bf16_max, 1e38], dtype=torch.bfloat16)
    c = summation().compare("out", finite_max, bound)
    assert not c.passed and "index (0,)" in c.message  # past the threshold a finite result is wrong
    no_room = ErrorBound(np.array([-3.0e38]), np.array([0.0]), "bf16")
    assert not summation().compare("out", torch.tensor([-math.inf], dtype=torch.bfloat16), no_room).passed


# -- the share of its bound each element used (Comparison.bound_used) ----------------------------


def _used(policy, actual, expected):
    c = policy.compare("y", actual, expected)
    return c.bound_used, c.passed


def test_ulp_share_is_the_ulp_error_over_the_bound():
    x = np.array([1.0, 2.0])
    one_ulp_up = torch.tensor([1.0 + 2.0**-23, 2.0])  # 1 ULP above an exactly representable 1.0
    assert _used(ulp(max=1), one_ulp_up, x) == (1.0, True)
    assert _used(ulp(max=2), one_ulp_up, x) == (0.5, True)
    assert _used(ulp(max=0.5), one_ulp_up, x) == (2.0, False)
    assert _used(ulp(max=0), torch.tensor([1.0, 2.0]), x) == (0.0, True)
    assert _used(ulp(max=0), one_ulp_up, x) == (math.inf, False)
    assert ulp(max=1).compare("y", one_ulp_up, x).extra["allowed_ulp"] == 1.0


def test_codes_share_is_the_code_distance_over_the_bound():
    x = np.array([1.0, 2.0])
    one_code_up = torch.tensor([1.125, 2.0]).to(torch.float8_e4m3fn)
    assert _used(codes("e4m3", 1), one_code_up, x) == (1.0, True)
    assert _used(codes("e4m3", 2), one_code_up, x) == (0.5, True)
    assert _used(codes("e4m3", 0), one_code_up, x) == (math.inf, False)
    assert _used(codes("e4m3", 0), torch.tensor([1.0, 2.0]).to(torch.float8_e4m3fn), x) == (0.0, True)
    assert codes("e4m3", 1).compare("y", one_code_up, x).extra["allowed_codes"] == 1.0


def test_relative_share_is_the_relative_error_over_the_bound():
    x = np.array([1000.0, -5.0])
    assert _used(relative(1e-3), torch.tensor([1001.0, -5.0]), x) == (1.0, True)
    assert _used(relative(1e-3), torch.tensor([1000.5, -5.0]), x) == (0.5, True)
    assert _used(relative(1e-3), torch.tensor([1002.0, -5.0]), x) == (2.0, False)
    assert _used(relative(1e-3), torch.tensor([1000.0, -5.0]), x) == (0.0, True)
    assert relative(1e-3).compare("y", torch.tensor([1000.0, -5.0]), x).extra["allowed_relative"] == 1e-3


def test_within_share_is_the_distance_over_the_bracket_side_it_lies_on():
    from tkverify.policies import Bracket, within

    def used(a, exact=1.0, low=0.5, high=2.0):
        bracket = Bracket(np.array([exact]), np.array([low]), np.array([high]))
        return _used(within("fp32"), torch.tensor([a]), bracket)

    assert used(2.0) == (1.0, True) and used(0.5) == (1.0, True)  # at either end
    assert used(1.5) == (0.5, True) and used(0.75) == (0.5, True)  # half-way, above and below
    assert used(2.5) == (1.5, False) and used(0.25) == (1.5, False)  # past either end
    assert used(1.0) == (0.0, True)
    assert used(0.875, low=1.0) == (math.inf, False)  # nothing allowed below the exact value
    assert used(math.nan, exact=math.nan, low=math.nan, high=math.nan) == (0.0, True)  # the NaN it must be
    assert used(1.0, exact=math.nan, low=math.nan, high=math.nan) == (math.inf, False)
    assert used(math.nan) == (math.inf, False)
    assert used(123.0, low=-math.inf, high=math.inf) == (0.0, True)  # unconstrained


def test_summation_share_is_the_deviation_over_the_allowance():
    from tkverify.policies import ErrorBound, summation

    def used(y, error):
        return _used(summation(), torch.tensor([1.0, y]), ErrorBound(np.array([1.0, 3.0]), np.array([0.0, error]),
                                                                     "fp32"))

    assert used(3.0 + 2.0**-22, 2.0**-22) == (1.0, True)
    assert used(3.0 + 2.0**-22, 2.0**-21) == (0.5, True)
    assert used(3.0 + 2.0**-21, 2.0**-22) == (2.0, False)
    assert used(3.0, 0.0) == (0.0, True)
    assert used(3.0 + 2.0**-22, 0.0) == (math.inf, False)
    # An infinity the bound allows (a sum past bf16's overflow threshold) has no distance: at the bound.
    bound = ErrorBound(np.array([-3.51273687e38]), np.array([0.0]), "bf16")
    assert _used(summation(), torch.tensor([-math.inf], dtype=torch.bfloat16), bound) == (1.0, True)


def test_bitwise_share_is_zero_where_equal_and_inf_where_not():
    ints = np.array([[1, 2], [3, 4]], dtype=np.int64)
    assert _used(bitwise(torch.int64), torch.from_numpy(ints.copy()), ints) == (0.0, True)
    assert _used(bitwise(torch.int64), torch.from_numpy(ints + 1), ints) == (math.inf, False)
    a = torch.tensor([1.0, 2.0])
    assert _used(bitwise(), a, a.clone()) == (0.0, True)
    assert _used(bitwise(), a, torch.tensor([1.0, 2.0 + 2.0**-22])) == (math.inf, False)
    assert _used(bitwise(), a, np.array([1.0, 2.0])) == (0.0, True)  # against exact values
    assert _used(bitwise(), a, np.array([1.0, 2.0 + 2.0**-21])) == (math.inf, False)
    assert bitwise().compare("y", torch.zeros(3), np.zeros(2)).bound_used is None  # rejected whole


def test_the_share_of_the_bound_agrees_with_the_verdict_of_every_policy():
    """bound_used <= 1 exactly where the comparison passes, on random outputs near their expected values."""
    from tkverify.policies import Bracket, ErrorBound, summation, within

    rng = np.random.default_rng(5)
    for _ in range(200):
        x = rng.standard_normal(6) * np.exp2(rng.integers(-4, 4, size=6))
        a = torch.tensor(x * (1 + rng.standard_normal(6) * 2.0**-rng.integers(10, 30)), dtype=torch.float32)
        half = np.abs(x) * 2.0**-rng.integers(12, 24)
        for policy, expected in ((ulp(max=float(rng.integers(0, 4))), x), (codes("fp32", int(rng.integers(0, 4))), x),
                                 (relative(2.0**-rng.integers(10, 25)), x),
                                 (within("fp32"), Bracket(x, x - half, x + half)),
                                 (summation(), ErrorBound(x, half, "fp32")), (bitwise(), x)):
            c = policy.compare("y", a, expected)
            assert (c.bound_used <= 1) == c.passed, (policy, x, a)
