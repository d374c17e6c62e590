"""tkverify: differential testing and numerics verification of GPU kernels against float64 oracles.

Importing tkverify never imports tilelang.
"""

from tkverify.case import Case, load_case, save_case
from tkverify.policies import bitwise, codes, relative, ulp
from tkverify.registry import Impl, OpSpec, all_specs, get, register, register_impl

__version__ = "0.1.0"

__all__ = [
    "Case", "Impl", "OpSpec", "all_specs", "bitwise", "codes", "get", "load_case", "register",
    "register_impl", "relative", "save_case", "ulp",
]
