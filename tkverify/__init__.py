"""tkverify: differential testing and numerics verification of GPU kernels against float64 oracles.

The names below are what a user's own spec or implementation needs (`examples/my_kernel.py`
uses them): the op declaration (`OpSpec`, `Impl`, `Backward`, `BenchShape`), the case it is
drawn as (`Case`, saved and loaded with `save_case` and `load_case`), the policies that judge
its outputs, the registrations, `Unsupported` for a case an implementation cannot run,
`Failure` for the `known` hook of a library under test, and `load_plugins`, which imports a
user's module of registrations.  The tools (`tkverify.check`, `tkverify.report`, ...) and the
registry's lookups (`tkverify.registry.get`, `tkverify.registry.all_specs`) are imported from
their modules.  Importing tkverify never imports tilelang or pytest.
"""

from tkverify.case import Case, load_case, save_case
from tkverify.policies import Bracket, bitwise, codes, relative, ulp, within
from tkverify.registry import (
    Backward,
    BenchShape,
    Failure,
    Impl,
    OpSpec,
    Unsupported,
    load_plugins,
    register,
    register_backward_impl,
    register_impl,
)

__version__ = "0.1.0"

__all__ = [
    "Backward", "BenchShape", "Bracket", "Case", "Failure", "Impl", "OpSpec", "Unsupported", "bitwise", "codes",
    "load_case", "load_plugins", "register", "register_backward_impl", "register_impl", "relative", "save_case",
    "ulp", "within",
]
