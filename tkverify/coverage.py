"""What the differential suite reaches: the kernel paths each example launched, and the input classes drawn.

Kernel paths.  `kernels._tilelang.launches` records the (kernel, static configuration) of every compiled
kernel a TileLang wrapper asks for; `listening` wraps an implementation so that each call records what
it launched, and `path_labels` turns one judged example into the labels the report counts per
(op, impl) (`tkverify.report.rows.SpeedRow.coverage`):

* ``<kernel> | <config>``            the example launched that shipped configuration;
* ``<kernel> | <config> | <class>``  ... and its case is in that boundary class of the kernel;
* ``(no launch)`` and ``(no launch) | <class>``: the implementation returned without a launch (an
  empty batch: the wrappers return empty outputs without one).

The boundary classes are computed here from the case, never by the kernels: `boundary_classes()` lists, per
kernel, which classes apply (a partial tile along a tiled dimension, padding rows present, a single
row, ...), each a predicate of (case, config) and the configurations it can occur with.  Tuning
candidates (`KernelDef.candidates`) are exempt: no wrapper launches them, and they have their own
equality tests.  `coverage_list` lists every shipped configuration and each of its (config, class)
pairs with the examples a report counted (zero: a gap); the report writes it as coverage.json and
`gaps` names the zeros.

Input classes.  The strategies tag each drawn case with ``hypothesis.event("class: <name>")`` per
class it falls in (computed from the drawn tensors); `drawn_classes` reads the tags of the example
being run, which the report counts per (op, impl) like the layouts (`SpeedRow.classes`).

This module needs no tilelang: it reads the recorder and the case.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable, Hashable, Iterable, Mapping
from typing import Any

import torch

from tkverify import registry
from tkverify.case import Case

NO_LAUNCH = "(no launch)"
SEPARATOR = " | "
CLASS_EVENT = "class: "


# ------------------------------------------------------------ input classes


def drawn_classes() -> list[str]:
    """The input classes (``class: <name>`` events) the strategy tagged in the hypothesis example now
    running, sorted; none outside a hypothesis test."""
    from hypothesis.control import _current_build_context

    context = _current_build_context.value
    if context is None:
        return []
    events = getattr(context.data, "events", {})
    return sorted(e[len(CLASS_EVENT):] for e in events if isinstance(e, str) and e.startswith(CLASS_EVENT))


# ------------------------------------------------------- boundary classes


def _rows(name: str, row_dims: int = 1) -> Callable[[Case], int]:
    """The rows of input `name`: the product of its dimensions but the last `row_dims`."""
    def rows(case: Case) -> int:
        t = case.inputs[name]
        return math.prod(t.shape[:t.dim() - row_dims])
    return rows


def _last(name: str, dim: int = -1) -> Callable[[Case], int]:
    return lambda case: case.inputs[name].shape[dim]


@dataclasses.dataclass(frozen=True)
class Boundary:
    """A boundary class of one kernel: `hit(case, config)` says whether the case is in it; `applies(config)`
    which shipped configurations it can occur with (a coverage list holds a pair for each of those)."""

    name: str
    hit: Callable[[Case, Any], bool]
    applies: Callable[[Any], bool] = lambda config: True


def single_row(rows: Callable[[Case], int]) -> Boundary:
    return Boundary("single_row", lambda case, config: rows(case) == 1)


def _block_tile_cols(config) -> int:
    from kernels.quant.block_cast import block_geometry  # layer: tile sizes of a configuration, no tilelang

    return block_geometry(config)[2]


def _transpose_tile(config) -> tuple[int, int]:
    from kernels.transpose import tile_shape  # layer: tile sizes of a configuration, no tilelang

    return tile_shape(config)


def _token_hidden(case: Case) -> int:
    """The hidden size a token_cast launch quantises: swiglu's input holds two halves."""
    h = case.inputs["x"].shape[-1]
    return h // 2 if "pos_to_token_topk" in case.inputs else h


def _cast_back_input(case: Case) -> torch.Tensor:
    """The codes a cast_back launch decodes: `data` (cast_back), or `x` (unpack_from_e2m1fn_x2's packed
    codes; per_token_cast_and_cast_back's values, cast and decoded in place)."""
    return case.inputs["data"] if "data" in case.inputs else case.inputs["x"]


def _cast_back_elements(case: Case, config) -> int:
    """The elements a cast_back launch writes: e2m1 codes come two a byte."""
    t = _cast_back_input(case)
    packed = t.element_size() == 1 and config.fmt == "e2m1"
    return t.numel() * (2 if packed else 1)


def _unreached_rows(case: Case) -> bool:
    """expand_to_fused: some of the N output rows no (token, k) pair reaches (padding rows, written zero)."""
    pos = case.inputs["token_topk_to_pos"].reshape(-1).long()
    n = int(case.params["num_expanded_rows"])
    return int(torch.unique(pos[(pos >= 0) & (pos < n)]).numel()) < n


def _unaligned_counts(case: Case) -> bool:
    """fused_mapping: an expert's pair count is not a multiple of the alignment (its padding rows)."""
    idx = case.inputs["topk_idx"].reshape(-1).long()
    counts = torch.bincount(idx[(idx >= 0) & (idx < case.params["num_experts"])],
                            minlength=case.params["num_experts"])
    return bool((counts % case.params["alignment"] != 0).any())


def _dropped_pairs(case: Case) -> bool:
    """reduce_fused: a (token, k) pair without a row (position -1) adds nothing."""
    return bool((case.inputs["token_topk_to_pos"] < 0).any())


_ROWS_X = _rows("x")


def _partial_tile(units: Callable[[Case, Any], int], per_tile: Callable[[Any], int]) -> Callable[[Case, Any], bool]:
    """A predicate: the `units` (threads, vectors, rows) of the launch do not fill whole tiles (CTAs or
    sweeps of `per_tile(config)`): the last one runs with lanes idle past the end."""
    return lambda case, config: units(case, config) % per_tile(config) != 0


def _vectors(elements: Callable[[Case], int], vector: int) -> Callable[[Case, Any], int]:
    """The vectors `elements` split into: `vector` a vector on a vectorised configuration, 1 otherwise."""
    return lambda case, config: -(-elements(case) // (vector if config.vectorized else 1))


def _scalar_tail(elements: Callable[[Case], int], vector: int, name: str = "hidden_tail") -> Boundary:
    """The scalar configuration's own trigger: a size not a multiple of the 16-byte vector (a misaligned
    tensor is the other one)."""
    return Boundary(name, lambda case, config: elements(case) % vector != 0, lambda config: not config.vectorized)


def _token_vector_classes(rows: Callable[[Case], int], hidden: Callable[[Case], int]) -> tuple[Boundary, ...]:
    """The mHC bf16 per-token vector kernels (`kernels.mhc.shared._launch_token_vectors`): a CTA of
    MIX_THREADS vectors of one token's row, 8 bf16 a vector where vectorised."""
    from kernels.mhc.shared import MIX_THREADS, MIX_VECTOR  # layer: tile sizes, no tilelang

    return (single_row(rows),
            Boundary("partial_block", _partial_tile(_vectors(hidden, MIX_VECTOR), lambda config: MIX_THREADS)),
            _scalar_tail(hidden, MIX_VECTOR))


def _quant_norm_classes(column: bool) -> tuple[Boundary, ...]:
    """quant.norm's kernels (kernels.quant.norm): a CTA of THREADS threads sweeps a row's vectors (norm_fwd,
    norm_bwd), or THREADS column vectors of a split of ROWS_PER_SPLIT rows (norm_wgrad)."""
    from kernels.quant.norm import _VECTOR, ROWS_PER_SPLIT, THREADS  # layer: tile sizes, no tilelang

    hidden = _last("x")

    def vectors(case, config):
        return -(-hidden(case) // (_VECTOR[config.dtype] if config.vectorized else 1))

    classes = (single_row(_ROWS_X), Boundary("partial_block", _partial_tile(vectors, lambda config: THREADS)),
               Boundary("hidden_tail", lambda case, config: hidden(case) % _VECTOR[config.dtype] != 0,
                        lambda config: not config.vectorized))
    if column:
        classes += (Boundary("partial_split", lambda case, config: _ROWS_X(case) % ROWS_PER_SPLIT != 0),)
    return classes


def _mhc_fused_norm_classes(bwd: bool) -> tuple[Boundary, ...]:
    """mhc.norm_fn (one thread a vector of fn (M, K)) and its backward (one thread a column vector)."""
    from kernels.mhc.fused_norm import THREADS, VECTOR  # layer: tile sizes, no tilelang

    k = _last("fn")
    rows = _rows("fn")

    def threads(case, config):
        per_row = -(-k(case) // (VECTOR if config.vectorized else 1))
        return per_row if bwd else rows(case) * per_row

    return (single_row(rows), Boundary("partial_block", _partial_tile(threads, lambda config: THREADS)),
            _scalar_tail(k, VECTOR, "k_tail"))


def _mhc_reduce_classes(bwd: bool) -> tuple[Boundary, ...]:
    """mhc.reduce_partials_and_rmsnorm: one thread an (token, column) of out_mul_splitted (S, N, G, M);
    its backward one thread a (token, group)."""
    from kernels.mhc.fused_norm import THREADS  # layer: tile sizes, no tilelang

    def threads(case, config):
        _, tokens, groups, width = case.inputs["out_mul_splitted"].shape
        return tokens * (groups if bwd else width)

    return (Boundary("single_row", lambda case, config: case.inputs["out_mul_splitted"].shape[1] == 1),
            Boundary("single_split", lambda case, config: case.inputs["out_mul_splitted"].shape[0] == 1),
            Boundary("partial_block", _partial_tile(threads, lambda config: THREADS)))


def _engram_hash_elements(case: Case, config) -> int:
    """engram.hash: one thread an output element, T tokens times the L (N - 1) K tables of vocab_sizes."""
    return case.inputs["ngram_token_ids"].shape[0] * case.inputs["vocab_sizes"].numel()


def _classes_from_tile_sizes() -> dict[str, tuple[Boundary, ...]]:
    """The boundary classes of the mHC head/fused-norm/backward, quant.norm, swiglu, grouped-routing and
    Engram hash/fused-weight kernels, read from their wrappers' tile sizes and dispatch."""
    from kernels.engram.fused_weight import FUSED_THREADS, FUSED_VECTOR  # layer: tile sizes, no tilelang
    from kernels.engram.hash import HASH_THREADS
    from kernels.mhc.head_mix import BWD_THREADS, ELEMENT_THREADS, FP32_VECTOR
    from kernels.mhc.split_mixes_bwd import SPLIT_BWD_THREADS
    from kernels.quant.swiglu_plain import SWIGLU_VECTOR

    tokens_x2 = _rows("x", 2)
    mixes_total = lambda case: case.inputs["mixes"].numel()  # noqa: E731
    mixes_rows = _rows("mixes")
    swiglu_hidden = lambda case: case.inputs["x"].shape[-1] // 2  # noqa: E731
    weight_elements = lambda case: case.inputs["weight_hidden"].numel()  # noqa: E731
    padded_streams = Boundary("padded_streams", lambda case, config: case.inputs["comb"].shape[-1] < config.padded)
    return {
        "mhc.expand_to_mhc": _token_vector_classes(_ROWS_X, _last("x")),
        "mhc.expand_to_mhc_bwd": _token_vector_classes(_ROWS_X, _last("x")),
        "mhc.pre_apply_mix_bwd": (single_row(tokens_x2), _scalar_tail(_last("x"), 8)),
        "mhc.post_bwd": (single_row(_ROWS_X), _scalar_tail(_last("x"), 8), padded_streams),
        "mhc.pre_split_mixes_bwd": (
            single_row(mixes_rows),
            Boundary("padded_mixes", lambda case, config: mixes_total(case) // max(mixes_rows(case), 1)
                     < config.padded * (config.padded + 2)),
            Boundary("partial_block", _partial_tile(lambda case, config: mixes_rows(case),
                                                    lambda config: SPLIT_BWD_THREADS)),
        ),
        "mhc.sinkhorn_bwd": BOUNDARY_SINKHORN,
        "mhc.head_compute_mix": (
            single_row(mixes_rows),
            Boundary("partial_block", _partial_tile(_vectors(mixes_total, FP32_VECTOR),
                                                    lambda config: ELEMENT_THREADS)),
            _scalar_tail(mixes_total, FP32_VECTOR, "element_tail"),
        ),
        "mhc.head_compute_mix_bwd": (
            single_row(mixes_rows),
            Boundary("partial_block", _partial_tile(lambda case, config: mixes_rows(case),
                                                    lambda config: BWD_THREADS)),
        ),
        "mhc.norm_fn": _mhc_fused_norm_classes(bwd=False),
        "mhc.norm_fn_bwd": _mhc_fused_norm_classes(bwd=True),
        "mhc.reduce_partials_and_rmsnorm": _mhc_reduce_classes(bwd=False),
        "mhc.reduce_partials_and_rmsnorm_bwd": _mhc_reduce_classes(bwd=True),
        "quant.norm_fwd": _quant_norm_classes(column=False),
        "quant.norm_bwd": _quant_norm_classes(column=False),
        "quant.norm_wgrad": _quant_norm_classes(column=True),
        "quant.swiglu_plain": (
            single_row(_ROWS_X),
            Boundary("hidden_tail", lambda case, config: swiglu_hidden(case) % SWIGLU_VECTOR != 0,
                     lambda config: config.vec == 1),
            Boundary("routed", lambda case, config: case.inputs.get("pos_to_token_topk") is not None),
        ),
        "moe.topk_sum_and_topk_group_idx": (single_row(_rows("scores", 2)),),
        "moe.unique_group_indices": (single_row(_rows("group_indices")),),
        "moe.aux_fi": (single_row(_rows("topk_idx")),),
        "engram.gate_bwd": (single_row(tokens_x2),),
        "engram.hash": (
            single_row(lambda case: case.inputs["ngram_token_ids"].shape[0]),
            Boundary("partial_block", _partial_tile(_engram_hash_elements, lambda config: HASH_THREADS)),
            Boundary("image_tokens", lambda case, config: case.inputs.get("image_token_mask") is not None),
        ),
        "engram.fused_weight": (
            Boundary("partial_block", _partial_tile(_vectors(weight_elements, FUSED_VECTOR),
                                                    lambda config: FUSED_THREADS)),
        ),
    }

BOUNDARY_SINKHORN = (
    single_row(_rows("x", 2)),
    Boundary("padded_matrix", lambda case, config: _last("x")(case) < config.padded),
)

# kernel name -> its boundary classes.  A kernel's classes are those of the cases that reach a launch:
# an empty batch returns before any (the `NO_LAUNCH` label counts it).
_BOUNDARY: dict[str, tuple[Boundary, ...]] = {
    "quant.token_cast": (
        single_row(_ROWS_X),
        # hidden % 8 != 0: rows zero-padded to whole 8-element chunks before the launch
        # (e5m6 asks H % 8 == 0 of its callers: no tail reaches its configurations)
        Boundary("hidden_tail", lambda case, config: _token_hidden(case) % 8 != 0,
                 lambda config: config.source == "x" and config.fmt != "e5m6"),
    ),
    "quant.block_cast": (
        single_row(_ROWS_X),
        Boundary("partial_row_tile", lambda case, config: _ROWS_X(case) % 128 != 0),
        Boundary("partial_col_tile", lambda case, config: _last("x")(case) % _block_tile_cols(config) != 0),
        # (a precomputed sf comes in whole blocks of 32 or 128 columns: no tail)
        Boundary("hidden_tail", lambda case, config: _last("x")(case) % 8 != 0, lambda config: not config.precomputed),
    ),
    "quant.cast_back": (
        Boundary("single_row", lambda case, config: math.prod(_cast_back_input(case).shape[:-1]) == 1),
        # the flat path: the last chunk of T * H elements ends inside a 16-byte chunk of the output
        Boundary("flat_tail", lambda case, config: _cast_back_elements(case, config)
                 % (8 if config.out_dtype == "bfloat16" else 4) != 0,
                 lambda config: config.path == "flat"),
    ),
    "transpose.batched_transpose": (
        # (a vectorised configuration takes M a multiple of its vector: never one row)
        Boundary("single_row", lambda case, config: _last("x", -2)(case) == 1, lambda config: not config.vectorized),
        Boundary("partial_tile_m", lambda case, config: _last("x", -2)(case) % _transpose_tile(config)[0] != 0),
        Boundary("partial_tile_n", lambda case, config: _last("x", -1)(case) % _transpose_tile(config)[1] != 0),
    ),
    "moe.topk_gate": (
        single_row(_rows("scores")),
        Boundary("padded_lanes", lambda case, config: _last("scores")(case) < config.width),
    ),
    "moe.group_count": (
        Boundary("single_element", lambda case, config: case.inputs["idx"].numel() == 1),
    ),
    "moe.fused_mapping": (
        single_row(_rows("topk_idx")),
        Boundary("padding_rows", lambda case, config: _unaligned_counts(case)),
    ),
    "moe.expand_to_fused": (
        single_row(_ROWS_X),
        Boundary("padding_rows", lambda case, config: _unreached_rows(case)),
    ),
    "moe.reduce_fused": (
        single_row(_rows("token_topk_to_pos")),
        Boundary("dropped_pairs", lambda case, config: _dropped_pairs(case)),
    ),
    "moe.normalize_weight": (single_row(_rows("topk_weights")),),
    "mhc.sinkhorn": BOUNDARY_SINKHORN,
    "mhc.pre_split_mixes": (single_row(_rows("mixes")),),
    "mhc.pre_apply_mix": (single_row(_rows("x", 2)),),
    "mhc.post": (
        single_row(_rows("x")),
        Boundary("padded_streams", lambda case, config: case.inputs["comb"].shape[-1] < config.padded),
    ),
    "engram.gate_fwd": (single_row(_rows("x", 2)),),
}


@functools.lru_cache(maxsize=1)
def boundary_classes() -> dict[str, tuple[Boundary, ...]]:
    """Per kernel, its boundary classes: `_BOUNDARY` (tile sizes read inside its predicates) and those
    `_classes_from_tile_sizes` builds from the wrappers' tile sizes, which import the kernel modules; built on
    first use, so that tkverify imports none of our kernels until one has launched."""
    return {**_BOUNDARY, **_classes_from_tile_sizes()}

# The classes of an example that launched nothing.
NO_LAUNCH_CLASSES = ("empty",)


def _is_empty(case: Case) -> bool:
    return any(t.numel() == 0 for t in case.inputs.values() if isinstance(t, torch.Tensor))


def config_label(config: Hashable) -> str:
    """A configuration as the report names it: its repr (a NamedTuple's names its fields)."""
    return repr(config)


def path_labels(case: Case, launched: Iterable[tuple[str, Hashable]]) -> list[str]:
    """The coverage labels of one judged example that launched `launched` (kernel name, config)."""
    labels: list[str] = []
    launched = list(dict.fromkeys(launched))
    if not launched:
        labels.append(NO_LAUNCH)
        if _is_empty(case):
            labels.append(SEPARATOR.join((NO_LAUNCH, "empty")))
        return labels
    for kernel, config in launched:
        head = SEPARATOR.join((kernel, config_label(config)))
        labels.append(head)
        for boundary in boundary_classes().get(kernel, ()):
            if boundary.applies(config) and _hit(boundary, case, config):
                labels.append(SEPARATOR.join((head, boundary.name)))
    return labels


def _hit(boundary: Boundary, case: Case, config) -> bool:
    """Whether the case is in the class; a case the predicate cannot read (an input another op names
    otherwise) is not."""
    try:
        return bool(boundary.hit(case, config))
    except (KeyError, IndexError, AttributeError, TypeError):
        return False


# --------------------------------------------------- recording around a call


class Listener:
    """What one implementation call launched, kept until the judged example's record reads it."""

    def __init__(self) -> None:
        self.launched: list[tuple[str, Hashable]] | None = None

    def take(self) -> list[tuple[str, Hashable]] | None:
        """The launches of the last call (None: no call since the last take, or a call that raised)."""
        launched, self.launched = self.launched, None
        return launched


def listening(impl: registry.Impl, listener: Listener, *, accumulate: bool = False) -> registry.Impl:
    """`impl` whose every call records into `listener` the kernels it launched
    (`kernels._tilelang.launches`); `impl` itself where kernels cannot be imported.  A call replaces
    what an earlier one recorded (one call per judged example: the differential suite), or with
    `accumulate` adds to what the calls since the last `Listener.take` launched (the gradient checks
    call a backward several times per example)."""
    try:
        from kernels import _tilelang  # layer: the process-local launch recorder only (no tilelang)
    except ImportError:
        return impl

    def call(*args, **kwargs):
        before = (listener.launched or []) if accumulate else []
        listener.launched = None
        with _tilelang.launches() as heard:
            result = impl.function()(*args, **kwargs)
        listener.launched = before + list(heard)
        return result

    return dataclasses.replace(impl, target=call)


def example_labels(case: Case, listener: Listener, classify=None) -> tuple[list[str], list[str]]:
    """(input classes, coverage labels) of the judged example now being recorded: the classes its
    strategy's ``classify`` finds in the case (each also tagged as a hypothesis event) and any the
    strategy tagged itself."""
    launched = listener.take()
    classes = set(drawn_classes())
    if classify is not None:
        from strategies.classes import tag_classes  # layer: tools read the strategies' classes

        found = classify(case)
        tag_classes(found)
        classes.update(found)
    return sorted(classes), ([] if launched is None else path_labels(case, launched))


# ------------------------------------------------------------- the list


def shipped_configs() -> dict[str, list[Hashable]]:
    """Every kernel of `kernels.KERNELS` and its shipped configurations (its tuning candidates left out)."""
    from kernels._tilelang import kernel_defs  # layer: the kernel registry (imports no tilelang)

    return {name: [c for c in k.configs if c not in k.candidates] for name, k in kernel_defs().items()}


def coverage_list(counts: Mapping[tuple[str, str], Mapping[str, int]],
                  shipped: Mapping[str, list[Hashable]] | None = None) -> dict[str, Any]:
    """Every shipped configuration with the examples that reached it, over all (op, impl) rows, the
    ops that did, and each applicable boundary class's examples: {kernel: {config: {"examples": n,
    "ops": [...], "classes": {class: n}}}}.  `counts` maps (op, impl) to its coverage labels' counts."""
    shipped = shipped_configs() if shipped is None else shipped
    out: dict[str, Any] = {}
    for kernel, configs in sorted(shipped.items()):
        entries = out[kernel] = {}
        for config in configs:
            head = SEPARATOR.join((kernel, config_label(config)))
            classes = {b.name: 0 for b in boundary_classes().get(kernel, ()) if b.applies(config)}
            entry = entries[config_label(config)] = {"examples": 0, "ops": [], "classes": classes}
            for (op, impl), labels in sorted(counts.items()):
                n = labels.get(head, 0)
                if n:
                    entry["examples"] += n
                    entry["ops"].append(f"{op}[{impl}]")
                for name in classes:
                    classes[name] += labels.get(SEPARATOR.join((head, name)), 0)
    return out


def gaps(listed: Mapping[str, Any]) -> list[str]:
    """Each shipped configuration of a coverage list that no example reached, and each (config, class)
    pair with no example: what the ci profile must still reach."""
    missing = []
    for kernel, configs in listed.items():
        for config, entry in configs.items():
            if not entry["examples"]:
                missing.append(f"{kernel} {config}: never launched")
                continue
            missing += [f"{kernel} {config}: never with {name}" for name, n in entry["classes"].items() if not n]
    return missing
