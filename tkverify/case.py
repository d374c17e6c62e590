"""A case: the static parameters and input tensors of one operator call.

Strategies draw cases, the runner feeds them to an implementation and to the
oracle, and a failing case is saved so that `tkverify replay PATH` can run it
again anywhere.  On disk a case is two files side by side:

* ``NAME.npz``  - every tensor as its raw bytes (so bf16 and fp8 survive numpy),
* ``NAME.json`` - op, implementation, parameters, each tensor's dtype and shape,
  and the library versions that produced it.

A tensor's layout is part of the case: a row-strided slice of a wider buffer or a
slice of a batch reaches an implementation as drawn.  `Case.to` copies the storage
a tensor views (up to its last element) and rebuilds the same view (strides and
storage offset) on the device, and a case file records the strides, the storage
offset and the storage size of every tensor that is not plainly contiguous
(`is_plain`); on load the storage is
filled with `SENTINEL_BYTE` (the bytes a layout's padding holds when drawn) and
the values are written into the view.  A tensor without that record (every
case file written before layouts were recorded) loads contiguous.
"""

from __future__ import annotations

import dataclasses
import json
import platform
from pathlib import Path
from typing import Any

import numpy as np
import torch

FORMAT_VERSION = 1

# Raw-byte carriers for every dtype a case may hold: numpy has no bf16 or fp8,
# so tensors travel as unsigned integers of the same width.
_CARRIER = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


# The byte a layout's padding (the storage outside a view's elements) is filled with: 0xFF is a NaN
# in every floating format a case holds (fp32, bf16, fp16, fp8 e4m3fn and e5m2) and -1 in the integer
# ones, so an implementation that reads padding shows it.
SENTINEL_BYTE = 0xFF


def dense_strides(shape) -> tuple[int, ...]:
    """The strides of a contiguous tensor of `shape` (row-major; a dimension of size 0 or 1 counts as 1)."""
    strides, step = [], 1
    for n in reversed(tuple(shape)):
        strides.append(step)
        step *= max(n, 1)
    return tuple(reversed(strides))


def is_plain(t: torch.Tensor) -> bool:
    """Whether `t` has exactly the strides of a contiguous tensor from the start of its storage (the layout
    a plain copy has).  Stricter than `is_contiguous`, which ignores the stride of a dimension of size 1:
    a single row sliced from a wider buffer keeps its row stride here."""
    return t.storage_offset() == 0 and t.stride() == dense_strides(t.shape)


def span_of(shape, stride, offset: int) -> int:
    """The elements of storage a view of this shape, strides and offset reaches: offset + 1 + its
    largest linear index (the offset alone for an empty view)."""
    if any(n == 0 for n in shape):
        return offset
    return offset + 1 + sum((n - 1) * s for n, s in zip(shape, stride))


def storage_span(t: torch.Tensor) -> int:
    """`span_of` `t`'s own shape, strides and storage offset."""
    return span_of(t.shape, t.stride(), t.storage_offset())


def sentinel_buffer(numel: int, dtype: torch.dtype, device: str | torch.device = "cpu") -> torch.Tensor:
    """A 1-D storage of `numel` elements whose every byte is `SENTINEL_BYTE` (bool: True)."""
    buffer = torch.empty(numel, dtype=dtype, device=device)
    if dtype == torch.bool:
        return buffer.fill_(True)
    buffer.view(torch.uint8).fill_(SENTINEL_BYTE)
    return buffer


def strided_view(values: torch.Tensor, stride: tuple[int, ...], offset: int, storage: int) -> torch.Tensor:
    """`values` written into a view with these strides and storage offset of a new sentinel-filled
    storage of `storage` elements, on `values`' device."""
    buffer = sentinel_buffer(storage, values.dtype, values.device)
    view = buffer.as_strided(tuple(values.shape), tuple(stride), offset)
    view.copy_(values)
    return view


def copy_layout(t: torch.Tensor, device: str | torch.device) -> torch.Tensor:
    """A copy of `t` on `device` with the same strides and storage offset, over a copy of the storage
    it views (padding included, so a sentinel in it comes along)."""
    if is_plain(t):
        return t.to(device, copy=True)
    span = storage_span(t)
    whole = t.as_strided((span,), (1,), 0).to(device, copy=True)
    return whole.as_strided(tuple(t.shape), t.stride(), t.storage_offset())


class CaseFileError(ValueError):
    """A case file that is missing, truncated, or not one of ours."""


@dataclasses.dataclass
class Case:
    """Static parameters (JSON values) and input tensors (CPU torch tensors).

    cotangent_dtype  the dtype name (``"bfloat16"``) of the cotangents a backward check hands the
    implementations, where the op's backward takes several (`Backward.grad_dtype` a tuple) and the
    strategy chooses; None: the backward chooses (`Backward.cotangent_dtype`).  Never passed to an
    implementation's forward."""

    params: dict[str, Any]
    inputs: dict[str, torch.Tensor]
    cotangent_dtype: str | None = None

    def describe(self) -> str:
        """Params and each tensor's shape and dtype, with its strides and storage offset where they are
        not those of a plain contiguous tensor."""
        shapes = ", ".join(
            f"{k}={tuple(v.shape)}:{str(v.dtype).replace('torch.', '')}"
            + ("" if is_plain(v) else f" strides {v.stride()} offset {v.storage_offset()}")
            for k, v in self.inputs.items()
        )
        return f"params={self.params} inputs[{shapes}]"

    def to(self, device: str | torch.device) -> dict[str, torch.Tensor]:
        """Copies of the inputs on `device`, each with the strides and storage offset it was drawn with
        (`copy_layout`): an implementation that writes into its input must not change what the oracle
        and the case file see."""
        return {k: copy_layout(v, device) for k, v in self.inputs.items()}

    def resized(self, axes: list[tuple[str, int]], size: int) -> "Case":
        """The same case with each (tensor name, dimension) of `axes` cut or repeated to `size`
        (contiguous): the values along the axis are tiled, so a row keeps the kind of values it had (a mix
        stays a mix, a token a token).  `tkverify replay --resize` uses it to find where along one size a
        failure begins."""
        inputs = dict(self.inputs)
        for name, dim in axes:
            if name not in inputs:
                raise KeyError(f"the case has no tensor {name!r} (it has {', '.join(inputs)})")
            t = inputs[name].contiguous()  # a tensor named twice (two of its axes) builds on its first resize
            if t.shape[dim] == 0 and size > 0:
                raise ValueError(f"{name} is empty along dimension {dim}: there is nothing to repeat")
            reps = -(-size // t.shape[dim]) if t.shape[dim] else 0
            tiled = torch.cat([t] * max(reps, 1), dim=dim) if reps > 1 else t
            inputs[name] = tiled.narrow(dim, 0, size).contiguous()
        return Case(dict(self.params), inputs, self.cotangent_dtype)


def versions() -> dict[str, str]:
    """The versions that matter for replaying a case or reading a report."""
    out = {
        "python": platform.python_version(),
        "numpy": np.__version__,
        "torch": torch.__version__,
    }
    try:  # installed-package metadata only: importing tilelang is never needed
        from importlib.metadata import PackageNotFoundError, version

        for dist in ("tkverify", "tilelang", "tile-kernels", "hypothesis"):
            try:
                out[dist] = version(dist)
            except PackageNotFoundError:
                pass
    except ImportError:  # pragma: no cover
        pass
    return out


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")


def _tensor_header(json_path: Path, name: str, info: Any) -> tuple[torch.dtype, tuple[int, ...]]:
    """A tensor's dtype and shape from its JSON entry, or the reason it is not one."""
    if not isinstance(info, dict) or not isinstance(info.get("dtype"), str) or "shape" not in info:
        raise CaseFileError(f"{json_path}: tensor {name!r} needs a dtype name and a shape, got {info!r}")
    shape = info["shape"]
    if not isinstance(shape, list) or not all(type(n) is int and n >= 0 for n in shape):
        raise CaseFileError(f"{json_path}: tensor {name!r} has the shape {shape!r}, not a list of sizes >= 0")
    dtype = getattr(torch, info["dtype"], None)
    if not isinstance(dtype, torch.dtype):
        raise CaseFileError(f"{json_path}: tensor {name!r} has the unknown dtype {info['dtype']!r}")
    return dtype, tuple(shape)


def _with_layout(json_path: Path, name: str, info: dict, values: torch.Tensor) -> torch.Tensor:
    """`values` in the layout the tensor's JSON entry records (strides, storage offset, storage size),
    or as they are where it records none."""
    if "strides" not in info:
        return values
    stride, offset, storage = info.get("strides"), info.get("storage_offset"), info.get("storage_size")
    strides_ok = isinstance(stride, list) and len(stride) == values.dim() and all(
        type(s) is int and s >= 0 for s in stride)
    if not (strides_ok and type(offset) is int and offset >= 0 and type(storage) is int):
        raise CaseFileError(f"{json_path}: tensor {name!r} needs strides (one integer >= 0 per dimension), a "
                            f"storage_offset and a storage_size, got {stride!r}, {offset!r}, {storage!r}")
    reach = span_of(values.shape, stride, offset)
    if storage < reach:
        raise CaseFileError(f"{json_path}: tensor {name!r} with strides {stride} and offset {offset} reaches "
                            f"{reach} elements of storage, more than its storage_size {storage}")
    return strided_view(values, tuple(stride), offset, storage)


def _base(path: str | Path) -> Path:
    """The path without .json/.npz (op names hold dots, so with_suffix("") would cut them)."""
    p = Path(path)
    return p.with_suffix("") if p.suffix in (".json", ".npz") else p


def save_case(path: str | Path, case: Case, *, op: str, impl: str, extra: dict | None = None) -> Path:
    """Write ``path``.npz and ``path``.json; returns the .json path (the one to replay)."""
    base = _base(path)
    base.parent.mkdir(parents=True, exist_ok=True)
    arrays, tensors = {}, {}
    for name, drawn in case.inputs.items():
        t = drawn.detach().cpu().clone(memory_format=torch.contiguous_format)
        arrays[name] = t.view(_CARRIER[t.element_size()]).numpy() if t.numel() else np.zeros(0, np.uint8)
        tensors[name] = {"dtype": _dtype_name(t.dtype), "shape": list(t.shape)}
        if not is_plain(drawn):
            tensors[name].update(strides=list(drawn.stride()), storage_offset=drawn.storage_offset(),
                                 storage_size=storage_span(drawn))
    np.savez(base.parent / (base.name + ".npz"), **arrays)
    meta = {
        "tkverify_case": FORMAT_VERSION,
        "op": op,
        "impl": impl,
        "params": case.params,
        "tensors": tensors,
        **({"cotangent_dtype": case.cotangent_dtype} if case.cotangent_dtype is not None else {}),
        "versions": versions(),
        **(extra or {}),
    }
    json_path = base.parent / (base.name + ".json")
    json_path.write_text(json.dumps(meta, indent=2, sort_keys=True))
    return json_path


def load_case(path: str | Path) -> tuple[Case, dict[str, Any]]:
    """Read a case written by `save_case`; raises `CaseFileError` with the reason."""
    given = Path(path)
    if given.is_file() and given.suffix not in (".json", ".npz"):
        raise CaseFileError(f"{given} is not a case file: a case is NAME.json beside NAME.npz")
    base = _base(path)
    json_path, npz_path = base.parent / (base.name + ".json"), base.parent / (base.name + ".npz")
    for p in (json_path, npz_path):
        if not p.exists():
            raise CaseFileError(f"case file {p} does not exist")
        if not p.is_file():
            raise CaseFileError(f"case file {p} is not a file")
    try:
        meta = json.loads(json_path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise CaseFileError(f"{json_path} is not valid JSON: {e}") from None
    if not isinstance(meta, dict) or meta.get("tkverify_case") != FORMAT_VERSION:
        raise CaseFileError(f"{json_path} is not a tkverify case file (format {FORMAT_VERSION})")
    for key, kind in (("op", str), ("impl", str), ("params", dict), ("tensors", dict)):
        if key not in meta:
            raise CaseFileError(f"{json_path} lacks the field {key!r}")
        if not isinstance(meta[key], kind):
            raise CaseFileError(f"{json_path}: the field {key!r} must be a JSON "
                                f"{'object' if kind is dict else 'string'}, got {type(meta[key]).__name__}")
    gradient = meta.get("gradient")
    if gradient is not None and not (isinstance(gradient, dict) and type(gradient.get("seed")) is int):
        raise CaseFileError(f"{json_path}: the field 'gradient' must be an object with an integer 'seed', "
                            f"got {gradient!r}")
    cotangent = meta.get("cotangent_dtype")
    if cotangent is not None and not isinstance(cotangent, str):
        raise CaseFileError(f"{json_path}: the field 'cotangent_dtype' must be a dtype name, got {cotangent!r}")
    try:
        with np.load(npz_path, allow_pickle=False) as npz:
            arrays = {k: npz[k] for k in npz.files}
    except Exception as e:  # zipfile, OSError, ValueError: all mean a damaged file
        raise CaseFileError(f"{npz_path} cannot be read ({type(e).__name__}: {e})") from None
    inputs = {}
    for name, info in meta["tensors"].items():
        if name not in arrays:
            raise CaseFileError(f"{npz_path} lacks the tensor {name!r}")
        dtype, shape = _tensor_header(json_path, name, info)
        raw = torch.from_numpy(np.ascontiguousarray(arrays[name]))
        n = int(np.prod(shape)) if shape else 1
        if n == 0:
            inputs[name] = torch.empty(shape, dtype=dtype)
            continue
        if raw.numel() != n or raw.element_size() != torch.empty((), dtype=dtype).element_size():
            raise CaseFileError(f"{npz_path}: tensor {name!r} holds {raw.numel()} elements, the header says {shape}")
        inputs[name] = _with_layout(json_path, name, info, raw.view(dtype).reshape(shape).clone())
    return Case(params=meta["params"], inputs=inputs, cotangent_dtype=cotangent), meta
