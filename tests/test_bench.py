"""tkverify bench: op selection, the declared shapes, ratios, merging and the markdown (CPU);
the timing itself on CUDA only."""

import inspect
import json

import pytest
import torch

from tkverify import bench, cli, registry


def _row(op, impl, time_us, kernel_us=None, shape="s", nbytes=4_200_000, target=0.9, flops=None, graph_error=None):
    row = {"op": op, "shape": shape, "impl": impl, "bytes": nbytes, "time_us": time_us, "kernel_us": kernel_us,
           "target": target, "flops": flops}
    return dict(row, graph_error=graph_error) if graph_error else row


def _doc(rows, tk_version="2.1.0", copy=4.2, commit="abc"):
    return {"meta": {"commit": commit, "versions": {"tile-kernels": tk_version, "torch": "2.11"}},
            "copy_bandwidth_TBps": copy, "write_bandwidth_TBps": 3.3, "rows": rows, "unavailable": []}


def test_select_by_substrings_and_backward_shapes():
    specs = registry.all_specs()
    every = bench.select(specs)
    assert {e.op for e in every} >= {"moe.topk_gate", "moe.expand_to_fused", "quant.per_token_cast",
                                     "transpose.transpose"}
    chosen = bench.select(specs, "topk_gate, swiglu_forward_and_per_token")
    assert {e.op for e in chosen} == {"moe.topk_gate", "moe.topk_gate_scored", "quant.swiglu_forward_and_per_token_cast"}
    assert bench.select(specs, "no-such-op") == []
    shape = registry.BenchShape("b", lambda d: ({}, {}), lambda i, p: 1)
    fake = registry.OpSpec("fam.op", None, None, {}, {}, bench=(shape,),
                           backward=registry.Backward(("x",), {"gx": None}, ("y",), None, {}, bench=(shape, shape)))
    parts = [e.part for e in bench.select([fake])]
    assert parts == ["forward", "backward", "backward"]
    assert bench.select([fake])[1].label == "fam.op (backward)"


def test_wanted_impls_lists_every_builtin_by_default():
    entries = bench.select(registry.all_specs(), "topk")
    assert bench.wanted_impls(entries, None)[:3] == ["torch", "tilelang", "tile_kernels"]
    assert bench.wanted_impls(entries, "tilelang, mine") == ["tilelang", "mine"]


@pytest.mark.parametrize("entry", bench.select(registry.all_specs()), ids=lambda e: f"{e.op}[{e.shape.name}]")
def test_declared_shapes_build_on_cpu(entry):
    """Each shape makes tensors on the device asked for, its byte count is what the op moves at least
    (every input it reads, read once), and the call signature fits the eager implementation's."""
    inputs, params = entry.shape.make(torch.device("cpu"))
    assert inputs and all(t.device.type == "cpu" for t in inputs.values())
    assert set(entry.shape.unread) <= set(inputs)
    read = sum(t.numel() * t.element_size() for name, t in inputs.items() if name not in entry.shape.unread)
    total = entry.shape.nbytes(inputs, params)
    # expand_to_fused writes about 8 times what it reads, batched_transpose_weight_sf about block_size / 2
    # times (each fp32 sf becomes a byte in each of the block's rows and columns)
    assert isinstance(total, int) and read <= total <= 80 * read
    fn = entry.impls["torch"].function()
    if inspect.isfunction(fn):  # (wrappers such as swiglu's take **kwargs)
        inspect.signature(fn).bind(**inputs, **params)


def test_expected_dtypes_and_sizes_of_key_shapes():
    got = {(e.op, e.shape.name): e for e in bench.select(registry.all_specs())}
    x = got["quant.per_token_cast", "T16384 H7168 bf16 e4m3/128"]
    inputs, params = x.shape.make(torch.device("cpu"))
    assert inputs["x"].dtype == torch.bfloat16 and inputs["x"].shape == (16384, 7168)
    # x 2 bytes + data 1 byte per element + one fp32 sf per 128
    assert x.shape.nbytes(inputs, params) == 16384 * 7168 * 3 + 16384 * 56 * 4
    e = got["moe.expand_to_fused", "T16384 K8 H7168 bf16"]
    inputs, params = e.shape.make(torch.device("cpu"))
    n = params["num_expanded_rows"]
    assert 16384 * 8 <= n <= 16384 * 8 + 256 * 127 and n % 128 == 0
    assert e.shape.nbytes(inputs, params) == 16384 * 7168 * 2 + n * 7168 * 2 + 16384 * 8 * 4
    t = got["transpose.transpose", "8191x8193 e4m3"]
    inputs, _ = t.shape.make(torch.device("cpu"))
    assert inputs["x"].dtype == torch.float8_e4m3fn and inputs["x"].shape == (8191, 8193)


def test_derive_bandwidth_target_and_ratio_to_tile_kernels():
    doc = bench.derive(_doc([_row("op", "tilelang", 1.0, kernel_us=0.5), _row("op", "tile_kernels", 1.5),
                             _row("op", "torch", 10.0, target=None)]))
    ours, theirs, eager = doc["rows"]
    assert ours["TBps"] == pytest.approx(4.2) and ours["of_copy"] == pytest.approx(1.0)  # by the eager time
    assert ours["met"] is True and ours["vs"] == {"tile_kernels": pytest.approx(1.5)}
    assert theirs["met"] is False and theirs["vs"] == {}
    assert eager["met"] is None and eager["vs"]["tile_kernels"] == pytest.approx(0.15)


def test_the_verdict_follows_the_eager_time_not_the_smaller_of_the_two():
    """Users call the ops eagerly: a row whose kernel meets its target in a graph but whose eager call is
    host-bound misses it, and the ratio to tile_kernels compares eager calls; a graph replay slower than the
    eager call (the evidence file framework.md#graph-replay-vs-eager of the committed reports) does not
    count against the row either."""
    host_bound = _row("moe.normalize_weight", "tilelang", 40.0, kernel_us=4.0, nbytes=16_800_000)
    theirs = _row("moe.normalize_weight", "tile_kernels", 20.0, kernel_us=8.0, nbytes=16_800_000)
    slow_replay = _row("mhc.post", "tilelang", 500.6, kernel_us=555.4, nbytes=2_100_000_000)
    norm, tk, post = bench.derive(_doc([host_bound, theirs, slow_replay]))["rows"]
    # 16.8 MB in 4 us is 100% of the 4.2 TB/s copy; in 40 us, 10%
    assert bench.judged_time_us(norm) == 40.0 and bench.best_time_us(norm) == 4.0
    assert norm["of_copy"] == pytest.approx(0.1) and norm["TBps"] == pytest.approx(0.42) and norm["met"] is False
    assert norm["vs"] == {"tile_kernels": pytest.approx(0.5)}  # slower eagerly, though its kernel is twice as fast
    assert tk["vs"] == {} and tk["met"] is False
    assert "eager call 36 us above its device time (host work)" in norm["notes"]
    assert bench.judged_time_us(post) == 500.6 and post["of_copy"] == pytest.approx(2.1e9 / 500.6e-6 / 4.2e12)
    assert "graph replay 55 us slower than the eager call: judged by the eager time" in post["notes"]
    assert bench.judged_time_us(_row("op", "torch", 3.0, kernel_us=None)) == 3.0
    assert bench.judged_time_us({**_row("op", "torch", None), "error": "boom"}) is None


def test_percentiles_of_known_samples():
    # inclusive quantiles: p10 and p90 at positions 0.1 (n - 1) and 0.9 (n - 1) of the sorted samples
    assert bench.percentiles([float(v) for v in range(11, 0, -1)]) == {"p10": 2.0, "p50": 6.0, "p90": 10.0}
    got = bench.percentiles([5.0, 1.0, 9.0, 3.0, 7.0, 2.0, 10.0, 4.0, 8.0, 6.0])
    assert got == {"p10": pytest.approx(1.9), "p50": 5.5, "p90": pytest.approx(9.1)}
    assert bench.percentiles([3.0]) == {"p10": 3.0, "p50": 3.0, "p90": 3.0}
    with pytest.raises(ValueError):
        bench.percentiles([])
    # a slow group in a quarter of the reps: the median stays in the fast one, the p90 lands in the slow one
    bimodal = [600.0] * 22 + [660.0] * 8
    assert bench.percentiles(bimodal) == {"p10": 600.0, "p50": 600.0, "p90": 660.0}
    row = {}
    bench.record_times(row, "graph", [1e-6 * v for v in range(1, 12)])
    assert row == {"kernel_p10_us": pytest.approx(2.0), "kernel_us": pytest.approx(6.0),
                   "kernel_p90_us": pytest.approx(10.0)}
    bench.record_times(row, "eager", [2e-6])
    assert (row["time_p10_us"], row["time_us"], row["time_p90_us"]) == pytest.approx((2.0, 2.0, 2.0))


def test_every_row_shows_both_series_percentiles_and_a_wide_spread_is_noted():
    row = dict(_row("op", "tilelang", 604.0, kernel_us=602.0, nbytes=2_400_000_000), time_p10_us=598.5,
               time_p90_us=606.0, kernel_p10_us=597.0, kernel_p90_us=661.2)
    doc = dict(_doc([row]), reps=30)
    md = bench.render_markdown(bench.derive(doc))
    assert "| op | s | tilelang | 598.5 / 604.0 / 606.0 | 597.0 / 602.0 / 661.2 |" in md
    assert "each as p10 / p50 / p90 of its 30 reps" in md
    assert "## Summary (eager p50 in us" in md and "| op | s | 604.0 (95%) |" in md
    (derived,) = doc["rows"]
    # graph p90 - p10 = 64.2 us, 11% of 602: noted; the eager reps' 7.5 us (1%) are not
    assert "graph replay reps spread 597-661 us (p10-p90), 11% of their median" in derived["notes"]
    assert not any(n.startswith("eager reps spread") for n in derived["notes"])


def test_a_bench_written_before_the_percentiles_renders_and_merges():
    old = _doc([_row("op", "tilelang", 100.0, kernel_us=90.0, nbytes=210_000_000),
                _row("op", "tile_kernels", 120.0, kernel_us=80.0, nbytes=210_000_000)])
    assert "reps" not in old
    md = bench.render_markdown(bench.derive(json.loads(json.dumps(old))))
    assert "| op | s | tilelang | - / 100.0 / - | - / 90.0 / - |" in md
    assert "| op | s | 100.0 (50%) | 120.0 (42%) |" in md  # eager medians, though tile_kernels' kernel is faster
    assert "reps (\"-\": a figure the run did not keep)" in md
    new_row = dict(_row("op", "tile_kernels", 110.0, nbytes=210_000_000), time_p10_us=105.0, time_p90_us=130.0)
    merged = bench.merge([old, dict(_doc([new_row], "1.0.0"), reps=30)])
    assert merged["reps"] is None  # the runs disagree (one kept none)
    ours = merged["rows"][0]
    assert ours["vs"] == {"tile_kernels==2.1.0": pytest.approx(1.2), "tile_kernels==1.0.0": pytest.approx(1.1)}
    md = bench.render_markdown(merged)
    assert "| op | s | tile_kernels==1.0.0 | 105.0 / 110.0 / 130.0 | - |" in md


def test_merge_labels_tile_kernels_versions_and_keeps_first_duplicate():
    a = _doc([_row("op", "tilelang", 1.0), _row("op", "tile_kernels", 2.0)], "2.1.0")
    a["unavailable"] = [{"op": "op2", "shape": "s", "impl": "tile_kernels", "reason": "none"}]
    b = _doc([_row("op", "tilelang", 9.0), _row("op", "tile_kernels", 4.0), _row("op2", "tile_kernels", 1.0)],
             "1.0.0", copy=2.1, commit="def")
    merged = bench.merge([a, b])
    impls = [(r["op"], r["impl"]) for r in merged["rows"]]
    assert impls == [("op", "tilelang"), ("op", "tile_kernels==2.1.0"), ("op", "tile_kernels==1.0.0"),
                     ("op2", "tile_kernels==1.0.0")]
    ours = merged["rows"][0]
    assert ours["time_us"] == 1.0  # the first run's
    assert ours["vs"] == {"tile_kernels==2.1.0": pytest.approx(2.0), "tile_kernels==1.0.0": pytest.approx(4.0)}
    assert merged["rows"][2]["of_copy"] == pytest.approx(4_200_000 / 4e-6 / 2.1e12)  # its own run's ceiling
    assert merged["dropped"] == [{"op": "op", "shape": "s", "impl": "tilelang", "commit": "def"}]
    assert merged["unavailable"] == []  # op2's tile_kernels came from the second run
    md = bench.render_markdown(merged)
    assert "| op | s | 1.0 (100%) | 4.0 (50%) | 2.0 (50%) |" in md  # 1.0.0 at its own 2.1 TB/s
    assert "tile_kernels==1.0.0: 4.00x" in md and "tile_kernels==2.1.0: 2.00x" in md
    assert "commit def" in md


def test_markdown_shows_errors_misses_and_unavailable():
    doc = _doc([_row("op", "tilelang", 5.0), {**_row("op", "torch", None), "error": "RuntimeError: boom"}])
    doc["unavailable"] = [{"op": "op", "shape": "s", "impl": "tile_kernels", "reason": "not installed"}]
    md = bench.render_markdown(bench.derive(doc))
    assert "error: RuntimeError: boom" in md
    assert "**no**" in md  # 20% of copy against a 90% target
    assert "- op [s] tile_kernels: not installed" in md


def test_summary_marks_an_uncapturable_rows_eager_time():
    # a call that synchronises (a range check reading device memory): its eager time (host-bound), unmarked,
    # reads as a kernel five times slower than a plain call's (the evidence file framework.md, #routed-swiglu-eager)
    doc = _doc([_row("op", "tilelang", 334.3, graph_error="AcceleratorError: capture invalidated"),
                _row("op", "torch", 5.0, kernel_us=4.0), _row("op2", "tilelang", 2.0)])
    md = bench.render_markdown(bench.derive(doc))
    assert "| op | s | 334.3* (0%) | 5.0 (20%) |" in md
    assert "| op2 | s | 2.0 (50%) |" in md  # no graph timing asked for: not marked
    assert "\\* no graph time: the call cannot be captured" in md
    assert "\\* no graph" not in bench.render_markdown(bench.derive(_doc([_row("op", "tilelang", 2.0)])))


def test_cli_merge_writes_json_and_markdown(tmp_path):
    paths = []
    for name, version in (("a", "2.1.0"), ("b", "1.0.0")):
        p = tmp_path / f"{name}.json"
        p.write_text(json.dumps(_doc([_row("op", "tile_kernels", 2.0)], version)))
        paths.append(str(p))
    assert cli.main(["bench", "--merge", *paths, "--out", str(tmp_path / "out")]) == 0
    doc = json.loads((tmp_path / "out" / "bench.json").read_text())
    assert {r["impl"] for r in doc["rows"]} == {"tile_kernels==2.1.0", "tile_kernels==1.0.0"}
    assert (tmp_path / "out" / "bench.md").read_text().startswith("# tkverify bench")
    assert cli.main(["bench", "--merge", str(tmp_path / "missing.json"), "--out", str(tmp_path)]) == 2


def test_cli_bench_rejects_an_unknown_op(capsys):
    assert cli.main(["bench", "-k", "no-such-op"]) == 2
    assert "no op" in capsys.readouterr().err


@pytest.mark.skipif(not torch.cuda.is_available(), reason="timing needs CUDA")
def test_timing_a_copy_on_cuda():
    shape = registry.BenchShape("copy", lambda d: ({"x": torch.ones(2**24, device=d)}, {}), lambda i, p: 2**27)
    spec = registry.OpSpec("fam.copy", None, None, {}, {"torch": registry.Impl("torch", lambda x: x.clone())},
                           bench=(shape,))
    doc = bench.run(bench.select([spec]), ["torch", "tile_kernels"], reps=5, log=lambda s: None)
    (row,) = doc["rows"]
    assert row["time_us"] > 0 and row["kernel_us"] > 0 and 0 < row["of_copy"] < 2
    assert row["time_p10_us"] <= row["time_us"] <= row["time_p90_us"] and doc["reps"] == 5
    assert row["kernel_p10_us"] <= row["kernel_us"] <= row["kernel_p90_us"]
    assert doc["unavailable"][0]["impl"] == "tile_kernels"


def test_notes_say_only_what_the_measurements_show():
    from tkverify.bench import measured_notes

    base = {"target": 0.9, "met": False, "of_copy": 0.79, "of_write": 1.01, "time_us": 700.0, "kernel_us": 690.0}
    # above the write-only rate, but with no declared writes: nothing says it is write-bound
    assert measured_notes(base) == ["below target; not explained by these measurements"]
    host = dict(base, of_write=0.5, time_us=246.0, kernel_us=98.0)
    assert measured_notes(host) == ["eager call 148 us above its device time (host work)"]
    assert measured_notes(dict(base, of_write=0.3)) == ["below target; not explained by these measurements"]
    assert measured_notes(dict(base, met=True, of_write=1.3)) == []
    uncapturable = dict(base, of_write=0.1, kernel_us=None, graph_error="RuntimeError: operation not permitted")
    assert measured_notes(uncapturable) == ["not capturable in a CUDA graph (RuntimeError): eager time only"]
    slow_group = dict(base, met=True, time_p10_us=596.0, time_us=600.0, time_p90_us=661.0, kernel_us=598.0)
    assert measured_notes(slow_group) == ["eager reps spread 596-661 us (p10-p90), 11% of their median"]
    assert measured_notes(dict(slow_group, time_p90_us=620.0)) == []  # 4% of the median


def test_a_miss_is_write_bound_only_when_the_declared_writes_alone_overrun_the_target():
    # copy 4.2 TB/s, write-only 3.3 TB/s (_doc); 2333 MB moved, 2097 MB of them written, as the expand
    # shape at T 16384: the writes alone take 635 us, the 90% target allows 617 us
    expand = dict(_row("moe.expand_to_fused", "tilelang", 700.0, kernel_us=640.0, nbytes=2_333_000_000),
                  written=2_097_000_000)
    (row,) = bench.derive(_doc([expand]))["rows"]
    assert row["met"] is False
    assert row["write_floor_us"] == pytest.approx(635.5, abs=0.1)
    assert row["target_us"] == pytest.approx(617.2, abs=0.1)
    # judged by its eager 700 us, it writes at 91% of the write-only rate (99% by its 640 us graph time)
    assert row["notes"] == ["bound by writes: its 2097 MB of writes alone take 635 us at the write-only rate "
                            "measured here, more than the 617 us its target allows; it runs at 91% of that rate"]
    # a third of the bytes written (the Engram forward's mix): missing the target is not the writes' doing,
    # however high its bytes over the write-only rate
    engram = dict(_row("engram.gate", "tilelang", 130.0, kernel_us=125.0, nbytes=436_500_000), written=134_000_000)
    (row,) = bench.derive(_doc([engram]))["rows"]
    assert row["of_write"] > 1 and row["notes"] == ["below target; not explained by these measurements"]
