"""The op registry: one declaration per operator, read by tests, reports and the CLI.

An `OpSpec` joins an operator's oracle, the strategy that draws its cases, the
implementations that can run it and the policy that judges each output.
Implementations are named by import path ("package.module:function") and
imported only when used, so declaring a TileLang implementation never imports
tilelang.
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.util
import os
import pkgutil
import sys
import zlib
from typing import TYPE_CHECKING, Any, Callable

import torch

from strategies.layouts import check_layouts

if TYPE_CHECKING:
    from tkverify.case import Case

# Implementations every built-in op may have, in the order `--tk-impl all` runs them.
BUILTIN_IMPLS = ("torch", "tilelang", "tile_kernels")


class Unsupported(BaseException):
    """An implementation cannot run this case: the library lacks the option, format,
    size or input domain it asks for (say which, and in which version, in `reason`).

    It is not a discrepancy: `check_case` saves no case file for it, the
    differential suite records it per (op, implementation) as "unsupported" in
    the report, and a test whose every example is unsupported is skipped with the
    reasons.  It derives from BaseException, not Exception, so that the code which
    catches an implementation's errors (``except Exception`` in `check_case`, the
    gradient checks and the adapters) lets it through; one that reaches a pytest
    test is reported as a skip with its reason by the tkverify plugin.
    """

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason

    def __str__(self) -> str:
        return self.reason


class KnownDiscrepancy(Unsupported):
    """A failure the implementation is known to have on this case: a committed finding
    about an implementation under test (say which, and where it is written up, in `reason`).

    `check_case` raises it in place of the failure only when the implementation's
    `known` hook recognises both the case (the finding's input domain) and the
    failure itself (the outputs that disagree, or the error raised), so a new
    failure on the same op still fails.  It is counted like `Unsupported`, under
    its own heading in the report; the report's rows still show the failing
    elements.  Whether the finding still reproduces is the replay's job
    (`tkverify replay` of its committed case).
    """

    PREFIX = "known discrepancy"

    def __init__(self, finding: str):
        super().__init__(f"{self.PREFIX} {finding}")


@dataclasses.dataclass(frozen=True)
class Failure:
    """What went wrong on one case, as a `known` hook sees it: the op, whether the backward
    was being checked, the outputs that disagree (None: the implementation raised), and the
    failure's text (the error, or the comparisons' messages)."""

    op: str
    backward: bool
    outputs: frozenset[str] | None
    message: str


@dataclasses.dataclass
class Impl:
    """One implementation of an op: a callable taking ``**inputs, **params``.

    ``device`` is where its inputs go: "cuda", "cpu", or "auto" (CUDA when
    present, else CPU).  ``requires`` lists importable modules it needs; an
    implementation whose requirements are missing is reported as unavailable
    with the reason, never silently dropped.  ``available`` is the
    implementation's own check, run after those: it returns None, or why the
    implementation cannot run here (an installed library version that lacks the
    op, say).  A case it cannot run is refused at call time with `Unsupported`.
    ``known(case, failure)`` (optional) returns a finding's id and title when a
    failure on a case is one the implementation is known to have (see
    `KnownDiscrepancy`), else None: for libraries under test, never for our own.
    ``layouts`` maps an input to the memory layouts the implementation accepts for it
    (`strategies.layouts.LAYOUTS`: "contiguous", "row_strided", "batch_slice"); the
    differential suite draws each such input among them (`strategies.layouts.with_layouts`).
    An input it does not name is drawn contiguous.
    """

    name: str
    target: str | Callable[..., Any]
    device: str = "cuda"
    requires: tuple[str, ...] = ()
    available: Callable[[], str | None] | None = None
    known: Callable[[Any, Failure], str | None] | None = None
    layouts: dict[str, tuple[str, ...]] = dataclasses.field(default_factory=dict)

    def __post_init__(self) -> None:
        check_layouts(self.layouts)

    def unavailable_reason(self) -> str | None:
        if self.device == "cuda" and not torch.cuda.is_available():
            return f"implementation {self.name!r} needs CUDA, which this machine lacks"
        for module in self.requires:
            if importlib.util.find_spec(module) is None:
                return f"implementation {self.name!r} needs the module {module!r}, which is not installed"
        if isinstance(self.target, str):
            module = self.target.partition(":")[0]
            try:
                found = importlib.util.find_spec(module) is not None
            except ModuleNotFoundError:  # its parent package is missing
                found = False
            if not found:
                return f"implementation {self.name!r}: {module} does not exist (yet)"
        if self.available is not None:
            return self.available()
        return None

    def resolve_device(self) -> torch.device:
        if self.device == "auto":
            return torch.device("cuda" if torch.cuda.is_available() else "cpu")
        return torch.device(self.device)

    def function(self) -> Callable[..., Any]:
        if callable(self.target):
            return self.target
        module, _, attr = self.target.partition(":")
        fn = importlib.import_module(module)
        for part in attr.split("."):
            fn = getattr(fn, part)
        return fn


def torch_impl(target: str | Callable[..., Any], layouts: dict[str, tuple[str, ...]] | None = None) -> Impl:
    """The eager PyTorch implementation: runs on CUDA when there is one, else on CPU; `layouts` as `Impl`'s."""
    return Impl("torch", target, device="auto", layouts=dict(layouts or {}))


def tilelang_impl(target: str | Callable[..., Any]) -> Impl:
    return Impl("tilelang", target, device="cuda", requires=("tilelang",))


@dataclasses.dataclass
class Backward:
    """The backward of an op, for the gradient checks of `tkverify.gradients`.

    inputs   the differentiable inputs (case input names), in the order of `grads`.
    grads    gradient name -> policy, in the order backward callables return them
             (one per input: grads[i] is the gradient of inputs[i]).
    outputs  the forward outputs that carry a cotangent; a backward callable
             receives it as ``grad_<output>``.
    oracle   the float64 backward derived by hand:
             ``oracle(grad_<output>=..., **case.inputs, **case.params)`` returns
             the gradients (float64) in the order of `grads`.
    forward  a float64 torch forward (``forward(**inputs, **params)``, returning
             outputs as the op's oracle does) through which ``gradcheck`` takes
             finite differences; defaults to the op's oracle.
    impls    implementation name -> `Impl` of its backward, called as
             ``bwd(grad_<output>=..., **inputs, **saved, **case.params)`` where
             `saved` are the `saved` outputs of the same implementation's forward.
    saved    forward outputs passed on to the implementations' backward.
    grad_dtype  dtype of the cotangents handed to implementations (default: the
             dtype of the implementation's forward output); a tuple of dtypes: one
             of them per example, the case's (`Case.cotangent_dtype`) or one chosen by
             the example's inputs and cotangent seed (a backward that takes cotangents
             of several dtypes is checked with each).
    optional_outputs  outputs whose cotangent an implementation may be given as None
             (the call without that gradient): the checks pass None where such an
             output's cotangent is zero everywhere (a `mask` that zeroes it whole).
    mask     ``mask(case, margin) -> {output: bool array}`` (broadcastable to
             the output): elements whose cotangent is set to zero, because the
             derivative there is not checkable.  ``margin=None``: only what is
             outside the op's judged domain; a float: also what lies within that
             (op-defined, relative) margin of a kink, as finite differences need.
    fd_scale ``fd_scale(case) -> {input: float64 tensor}``: per-element size of a
             unit finite-difference step (default: |value| + 2^-6 rms of its row,
             the last axis).
    fd_margin   the kink margin that finite-difference checks pass to `mask`.
    kink_margin the margin that the comparison with the float64 backward passes to
             `mask` (elements an implementation's working precision may put on
             either side of a kink); None: only the domain.
    given    optional ``given(case, cotangents, exact) -> {grad: expected}``:
             turns the oracle's exact gradients into what the policies compare
             against (e.g. per-element `Bracket`s from an error analysis).
    smooth   optional ``smooth(case, outputs) -> {output: (values, noise)}``: an
             implementation's differentiated outputs rebuilt in float64 from its
             higher-precision outputs (values) with a per-element bound on their
             evaluation error (noise), for the consistency check in working
             precision; without it the outputs themselves are used.
    bench    `BenchShape`s of the backward: ``make`` returns the keyword
             arguments of a backward call (cotangents, inputs, saved outputs).
    examples_factor  the gradient checks run this many times the profile's
             examples: a backward whose kernel has more configurations than the
             profile's examples reach with their boundary classes (the plain
             SwiGLU's 16: x, cotangent and output dtype, vector width).
    """

    inputs: tuple[str, ...]
    grads: dict[str, Any]
    outputs: tuple[str, ...]
    oracle: Callable[..., Any]
    impls: dict[str, Impl]
    forward: Callable[..., Any] | None = None
    saved: tuple[str, ...] = ()
    grad_dtype: torch.dtype | tuple[torch.dtype, ...] | None = None
    optional_outputs: tuple[str, ...] = ()
    mask: Callable[..., dict[str, Any]] | None = None
    fd_scale: Callable[..., dict[str, torch.Tensor]] | None = None
    fd_margin: float = 1e-4
    kink_margin: float | None = None
    given: Callable[..., dict[str, Any]] | None = None
    smooth: Callable[..., dict[str, Any]] | None = None
    bench: tuple["BenchShape", ...] = ()  # timed like the forward's; make() returns the backward's kwargs
    examples_factor: int = 1

    def cotangent_dtype(self, case: Case, seed: int) -> torch.dtype | None:
        """`grad_dtype`, or where it is a tuple the one this example takes: the case's own choice
        (`Case.cotangent_dtype`, which a strategy sets to cycle the kernel's configurations) where it names one,
        else one chosen by a hash of the cotangent seed and the inputs' bytes (the seed alone is 0 in most ci
        examples), so that the examples cycle through them."""
        if not isinstance(self.grad_dtype, tuple):
            return self.grad_dtype
        if case.cotangent_dtype is not None:
            chosen = getattr(torch, case.cotangent_dtype, None)
            if chosen not in self.grad_dtype:
                raise ValueError(f"the case asks for {case.cotangent_dtype!r} cotangents; this backward takes "
                                 f"{', '.join(str(d).replace('torch.', '') for d in self.grad_dtype)}")
            return chosen
        digest = zlib.crc32(str(seed).encode())
        for name in sorted(case.inputs):
            if isinstance(case.inputs[name], torch.Tensor):
                digest = zlib.crc32(case.inputs[name].detach().cpu().contiguous().view(torch.uint8).numpy().tobytes(),
                                    digest)
        return self.grad_dtype[digest % len(self.grad_dtype)]

    def __post_init__(self) -> None:
        if len(self.grads) != len(self.inputs):
            raise ValueError(f"a backward needs one gradient per differentiable input: inputs {self.inputs}, "
                             f"grads {tuple(self.grads)}")

    def grad_of(self, name: str) -> str:
        """The gradient name of differentiable input `name`."""
        return list(self.grads)[self.inputs.index(name)]


@dataclasses.dataclass(frozen=True)
class BenchShape:
    """One benchmark shape of an op, for `tkverify bench`.

    name     short label, e.g. "T16384 H7168 bf16 e4m3/128".
    make     ``make(device) -> (inputs, params)``: the tensors and static
             parameters of one call, as a `Case` holds them; every
             implementation is called as ``impl(**inputs, **params)``.
    nbytes   ``nbytes(inputs, params) -> int``: the bytes the op must read and
             write, each counted once (the effective-bandwidth numerator).
    flops    optional ``flops(inputs, params) -> int`` where arithmetic matters.
    target   the share of the copy bandwidth this shape is tuned for (None:
             not memory-bound, judged by time alone).
    written  optional ``written(inputs, params) -> int``: the part of nbytes
             that is written.  With it the bench can tell a write-bound miss
             (its writes alone, at the write-only rate measured in the same
             run, take longer than the target allows) from any other.
    unread   the inputs passed for their shape and dtype only, none of whose
             elements the op reads (a backward given x beside the saved
             normalised input): nbytes leaves them out.
    pilot    optional ``pilot(device, fraction) -> (inputs, params)``: the same
             shape built with its token count cut to `fraction`, every input
             consistent with the others (a routing's positions inside the cut
             rows).  `tkverify sweep --production` times its host oracle on it;
             without it the sweep cuts the leading dimension of the inputs
             that share the first one's, which suits shapes with one token axis.
    row_local  every output row of a token depends on that token's input rows
             only (a token's residual streams, its routed slots), so that
             `tkverify sweep --production` may judge the shape in token chunks
             on the host's cores (`tkverify.sweep.chunks`).
    token_axis  (input, dimension) whose length is the token count, where the
             first input's first dimension longer than one is another axis (the
             split-K partials' S of mhc.pre_big_fuse); None: that dimension.
    """

    name: str
    make: Callable[[torch.device], tuple[dict[str, Any], dict[str, Any]]]
    nbytes: Callable[[dict[str, Any], dict[str, Any]], int]
    flops: Callable[[dict[str, Any], dict[str, Any]], int] | None = None
    target: float | None = 0.9
    written: Callable[[dict[str, Any], dict[str, Any]], int] | None = None
    unread: tuple[str, ...] = ()
    pilot: Callable[[torch.device, float], tuple[dict[str, Any], dict[str, Any]]] | None = None
    row_local: bool = False
    token_axis: tuple[str, int] | None = None


@dataclasses.dataclass
class OpSpec:
    """Everything tkverify knows about one operator.

    name      "family.op", e.g. "moe.topk_gate"; the family names the modules
              in kernels/, references/ and strategies/.
    oracle    float64 reference: ``oracle(**inputs, **params)`` returns the
              outputs (a tuple in the order of ``outputs``, or one array).
    strategy  zero-argument callable returning a hypothesis strategy of `Case`.
    outputs   output name -> policy, in the order implementations return them.
    impls     implementation name -> `Impl`.
    given     optional ``given(case, actual) -> {output: expected}``: expected
              values that depend on what the implementation produced (a
              quantised element judged given the implementation's own scale).
    backward  optional `Backward`: the op's gradient declaration.
    bench     `BenchShape`s timed by `tkverify bench` (none: not benchmarked).
    """

    name: str
    oracle: Callable[..., Any]
    strategy: Callable[[], Any]
    outputs: dict[str, Any]
    impls: dict[str, Impl]
    given: Callable[..., dict[str, Any]] | None = None
    doc: str = ""
    backward: Backward | None = None  # gradient checks (tkverify.gradients), where the op has a backward
    bench: tuple[BenchShape, ...] = ()

    @property
    def family(self) -> str:
        return self.name.split(".", 1)[0]

    def add_impl(self, impl: Impl) -> None:
        self.impls[impl.name] = impl


_REGISTRY: dict[str, OpSpec] = {}
_BUILTINS_LOADED = False


def register(spec: OpSpec) -> OpSpec:
    """Add an op to the registry (replacing one of the same name)."""
    _REGISTRY[spec.name] = spec
    return spec


def register_impl(op: str, impl: Impl) -> Impl:
    """Add an implementation of an already registered op: the one-line way to test your kernel."""
    get(op).add_impl(impl)
    return impl


def register_backward_impl(op: str, impl: Impl) -> Impl:
    """Add the backward of an implementation (registered with `register_impl`) to an op with a backward."""
    spec = get(op)
    if spec.backward is None:
        raise ValueError(f"{op} declares no backward")
    spec.backward.impls[impl.name] = impl
    return impl


def load_plugins(modules: list[str] | tuple[str, ...] = ()) -> None:
    """Import the built-in specs and adapters, then every module named (and those in TKVERIFY_LOAD).

    This is how a user's own module (its `register` and `register_impl` calls) gets
    loaded: ``tkverify report --load MODULE``, ``pytest --tk-load MODULE``, or a call here.
    """
    global _BUILTINS_LOADED
    if not _BUILTINS_LOADED:
        _BUILTINS_LOADED = True
        # Every module of tkverify.specs is imported; the family modules register their ops.
        import tkverify.specs  # layer: the registry loads the built-in declarations on its first lookup

        for info in pkgutil.iter_modules(tkverify.specs.__path__):
            importlib.import_module(f"tkverify.specs.{info.name}")
        # Adapters of other libraries add implementations to the ops declared above.
        import tkverify.adapters  # layer: the registry loads the built-in adapters on its first lookup

        adapters = [importlib.import_module(f"tkverify.adapters.{info.name}")
                    for info in pkgutil.iter_modules(tkverify.adapters.__path__)]
        # Each adapter registers once every adapter module is imported, so that one spread over several
        # modules (tile_kernels and its per-family tables) finds them all complete, whatever imported first.
        for module in adapters:
            if callable(getattr(module, "register_all", None)):
                module.register_all()
    extra = [m for m in os.environ.get("TKVERIFY_LOAD", "").split(",") if m]
    if (modules or extra) and os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())  # a user's module beside them, as `python -m` would find it
    for m in [*modules, *extra]:
        importlib.import_module(m)


def has(name: str) -> bool:
    """Whether an op of that name is registered (without loading anything: for plugins
    that extend ops declared before them)."""
    return name in _REGISTRY


def get(name: str) -> OpSpec:
    """The registered op of that name (the built-in specs and adapters are loaded first)."""
    load_plugins()
    try:
        return _REGISTRY[name]
    except KeyError:
        raise KeyError(f"no op named {name!r}; registered: {', '.join(sorted(_REGISTRY))}") from None


def all_specs() -> list[OpSpec]:
    """Every registered op, by name (the built-in specs and adapters are loaded first)."""
    load_plugins()
    return [_REGISTRY[k] for k in sorted(_REGISTRY)]


def impl_names() -> list[str]:
    """Every implementation name some registered op has, built-ins first."""
    names = {n for spec in all_specs() for n in spec.impls}
    return [n for n in BUILTIN_IMPLS if n in names] + sorted(names - set(BUILTIN_IMPLS))
