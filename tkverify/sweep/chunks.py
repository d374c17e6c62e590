"""A production shape judged in token chunks on the host's cores.

The host oracle of a bench shape is single-threaded NumPy over 10^8-10^9 elements: minutes a shape
(mhc.multilayer_recompute, moe.reduce_fused), while the machine that ran the kernels has a dozen idle
cores.  Where every output row of a token depends only on that token's input rows (`BenchShape.row_local`:
a token's residual streams, its routed slots), the shape splits along its token axis into chunks whose
oracle and judgement are independent: each chunk is a `Case` of its own, judged against the same slice of
every implementation's outputs, and the chunks' rows fold into one row per (implementation, output) the
way the report folds a run's examples (`tkverify.report.rows.fold_into`): its counts, errors and histogram
are the whole shape's, its worst element is named by its index in the whole output, and its ``cases`` and
``failures`` count chunks.

The token axis of a tensor is its first dimension as long as the token count (the first dimension longer
than one of the first input, as `production.shrink` cuts it); a tensor without one (reduce_fused's expanded
rows, which a token reaches through its positions) goes whole into every chunk.

The workers are threads: NumPy's and torch's array operations release the GIL, so that threads overlap
where those dominate a chunk (the oracle of a many-layer recomputation more than a light judgement), and
they share the inputs and outputs (GBs) without copying them.  (Forked processes would
share them too, but a child forked after torch's OpenMP pool has run hangs in its first parallel region.)
"""

from __future__ import annotations

import dataclasses
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable

import torch

from tkverify.case import Case
from tkverify.check import judge, oracle_outputs, run_oracle
from tkverify.registry import OpSpec
from tkverify.report.rows import ResultRow, fold_into

def token_count(inputs: dict[str, Any], axis: tuple[str, int] | None = None) -> int:
    """The length of the token axis: dimension axis[1] of input axis[0] (`BenchShape.token_axis`), else the
    first dimension longer than one of the first input tensor."""
    if axis is not None:
        name, dim = axis
        return inputs[name].shape[dim]
    tensors = [v for v in inputs.values() if isinstance(v, torch.Tensor) and v.dim()]
    return next((n for n in tensors[0].shape if n > 1), 1) if tensors else 1


def on_host(values: dict[str, Any]) -> dict[str, Any]:
    """`values` with every tensor copied to the host (detached); other values as they are."""
    return {k: v.detach().cpu() if isinstance(v, torch.Tensor) else v for k, v in values.items()}


def token_rows(value: Any, tokens: int, start: int, stop: int) -> Any:
    """`value` cut to tokens [start, stop) along its first dimension of length `tokens`; whole without one."""
    if not (isinstance(value, torch.Tensor) and tokens in value.shape):
        return value
    return value.narrow(list(value.shape).index(tokens), start, stop - start).contiguous()


def _judge_chunk(spec: OpSpec, params: dict[str, Any], inputs: dict[str, Any], actual: dict[str, dict[str, Any]],
                 tokens: int, label: Callable[[str], str], start: int, stop: int) -> list[ResultRow]:
    """The rows of every implementation on tokens [start, stop): one oracle, each implementation judged."""
    case = Case(params, {k: token_rows(v, tokens, start, stop) for k, v in inputs.items()})
    oracle = oracle_outputs(spec, case)
    rows = []
    for name, outputs in actual.items():
        part = {k: token_rows(v, tokens, start, stop) for k, v in outputs.items()}
        for c in judge(spec, part, run_oracle(spec, case, part, oracle=oracle)):
            whole = outputs.get(c.output)
            if c.worst is not None and isinstance(whole, torch.Tensor) and tokens in whole.shape:
                index = list(c.worst["index"])  # the worst element's index in the whole output, not the chunk
                index[list(whole.shape).index(tokens)] += start
                c = dataclasses.replace(c, worst={**c.worst, "index": index})
            rows.append(ResultRow.of(spec.name, name, dataclasses.replace(c, output=label(c.output))))
    return rows


def judge_in_chunks(spec: OpSpec, inputs: dict[str, Any], params: dict[str, Any],
                    actual: dict[str, dict[str, Any]], label: Callable[[str], str], *, workers: int,
                    chunk_tokens: int, token_axis: tuple[str, int] | None = None) -> list[ResultRow]:
    """One row per (implementation, output) of `actual` (implementation -> its named outputs, on the host),
    judged in chunks of `chunk_tokens` tokens on `workers` threads (1: in this one); `token_axis` as
    `token_count` takes it."""
    tokens = token_count(inputs, token_axis)
    bounds = [(s, min(s + chunk_tokens, tokens)) for s in range(0, tokens, max(1, chunk_tokens))]
    host = on_host(inputs)

    def chunk(b: tuple[int, int]) -> list[ResultRow]:
        return _judge_chunk(spec, params, host, actual, tokens, label, *b)

    if workers > 1 and len(bounds) > 1:
        with ThreadPoolExecutor(min(workers, len(bounds))) as pool:
            parts = list(pool.map(chunk, bounds))
    else:
        parts = [chunk(b) for b in bounds]
    table: dict[tuple[Any, ...], ResultRow] = {}
    for rows in parts:
        for row in rows:
            fold_into(table, row)
    return list(table.values())
