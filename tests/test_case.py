"""Case files: round trips of every dtype, and clear errors on damaged files."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tkverify import cli
from tkverify.case import Case, CaseFileError, load_case, save_case

DTYPES = [torch.float32, torch.bfloat16, torch.float16, torch.float8_e4m3fn, torch.int64, torch.int32, torch.uint8]


def test_round_trip_keeps_every_bit(tmp_path):
    g = torch.Generator().manual_seed(0)
    inputs = {f"t{i}": torch.randint(0, 256, (15 * d.itemsize,), dtype=torch.uint8, generator=g).view(d).reshape(3, 5)
              for i, d in enumerate(DTYPES)}
    inputs["empty"] = torch.empty(0, 7, dtype=torch.bfloat16)
    case = Case({"k": 3, "fmt": "e4m3"}, inputs)
    path = save_case(tmp_path / "c", case, op="moe.topk_gate", impl="torch")
    loaded, meta = load_case(path)
    assert loaded.params == case.params and meta["op"] == "moe.topk_gate" and "torch" in meta["versions"]
    for name, t in inputs.items():
        got = loaded.inputs[name]
        assert got.dtype == t.dtype and got.shape == t.shape
        assert torch.equal(got.view(torch.uint8), t.view(torch.uint8))


def _saved(tmp_path):
    return save_case(tmp_path / "c", Case({"k": 1}, {"scores": torch.ones(2, 4)}), op="moe.topk_gate", impl="torch")


def _edit_json(path, edit):
    meta = json.loads(path.read_text())
    edit(meta)
    path.write_text(json.dumps(meta))


def _set_tensor(field, value):
    return lambda meta: meta["tensors"]["scores"].update({field: value})


# Each damage turns a good case file of moe.topk_gate into a bad one; every one must be refused
# with exit status 2 and a one-line reason, never reach the implementation (that would be rc 1,
# a "FAIL" blamed on the kernel), never end in a traceback.
DAMAGES = {
    "truncate_npz": lambda js, npz: npz.write_bytes(npz.read_bytes()[:40]),
    "empty_npz": lambda js, npz: npz.write_bytes(b""),
    "garbage_json": lambda js, npz: js.write_text("{not json"),
    "binary_json": lambda js, npz: js.write_bytes(bytes(range(256))),
    "truncate_json": lambda js, npz: js.write_text(js.read_text()[: len(js.read_text()) // 2]),
    "not_ours": lambda js, npz: js.write_text(json.dumps({"hello": 1})),
    "json_list": lambda js, npz: js.write_text("[1, 2]"),
    "missing_npz": lambda js, npz: npz.unlink(),
    "missing_json": lambda js, npz: js.unlink(),
    "wrong_size": lambda js, npz: _edit_json(js, _set_tensor("shape", [3, 4])),
    "dtype_of_another_width": lambda js, npz: _edit_json(js, _set_tensor("dtype", "bfloat16")),
    "unknown_dtype": lambda js, npz: _edit_json(js, _set_tensor("dtype", "Tensor")),
    "tensor_without_dtype": lambda js, npz: _edit_json(js, lambda m: m["tensors"]["scores"].pop("dtype")),
    "negative_shape": lambda js, npz: _edit_json(js, _set_tensor("shape", [-2, -4])),
    "shape_not_a_list": lambda js, npz: _edit_json(js, _set_tensor("shape", "2x4")),
    "no_op": lambda js, npz: _edit_json(js, lambda m: m.pop("op")),
    "no_tensors": lambda js, npz: _edit_json(js, lambda m: m.pop("tensors")),
    "no_params": lambda js, npz: _edit_json(js, lambda m: m.pop("params")),
    "op_not_a_string": lambda js, npz: _edit_json(js, lambda m: m.update(op=["moe.topk_gate"])),
    "tensors_not_an_object": lambda js, npz: _edit_json(js, lambda m: m.update(tensors=[1, 2])),
    "params_not_an_object": lambda js, npz: _edit_json(js, lambda m: m.update(params=[1])),
    "unknown_op": lambda js, npz: _edit_json(js, lambda m: m.update(op="moe.no_such_op")),
    "tensor_missing_from_npz": lambda js, npz: _edit_json(
        js, lambda m: m["tensors"].update(extra={"dtype": "float32", "shape": [1]})),
    "missing_parameter": lambda js, npz: _edit_json(js, lambda m: m.update(params={})),
    "foreign_parameter": lambda js, npz: _edit_json(js, lambda m: m["params"].update(alignment=4)),
    "tensor_also_a_parameter": lambda js, npz: _edit_json(js, lambda m: m["params"].update(scores=1)),
    "case_of_another_op": lambda js, npz: _edit_json(js, lambda m: m.update(op="transpose.transpose")),
    "bad_gradient_header": lambda js, npz: _edit_json(js, lambda m: m.update(gradient={"precision": "auto"})),
}


@pytest.mark.parametrize("damage", sorted(DAMAGES))
def test_damaged_case_files_give_clear_errors(tmp_path, damage, capsys):
    path = _saved(tmp_path)
    DAMAGES[damage](path, path.with_suffix(".npz"))
    assert cli.main(["replay", str(path)]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.startswith("tkverify replay: ") and str(tmp_path) in captured.err
    assert captured.err.count("\n") == 1, captured.err


@pytest.mark.parametrize("damage", [d for d in DAMAGES if d not in ("unknown_op", "missing_parameter",
                                                                    "foreign_parameter", "case_of_another_op",
                                                                    "tensor_also_a_parameter")])
def test_damaged_case_files_raise_case_file_error(tmp_path, damage):
    """What load_case itself must catch (the rest needs the registry: the CLI checks it)."""
    path = _saved(tmp_path)
    DAMAGES[damage](path, path.with_suffix(".npz"))
    with pytest.raises(CaseFileError):
        load_case(path)


def test_a_file_that_is_not_a_case_is_named_as_such(tmp_path, capsys):
    other = tmp_path / "notes.txt"
    other.write_text("not a case\n")
    assert cli.main(["replay", str(other)]) == 2
    assert capsys.readouterr().err == f"tkverify replay: {other} is not a case file: a case is NAME.json beside NAME.npz\n"


@pytest.mark.parametrize("damage", ["truncate_npz", "unknown_op", "case_of_another_op"])
def test_replay_command_refuses_a_damaged_case_without_a_traceback(tmp_path, damage):
    """The command as a user types it: one line on stderr, exit 2."""
    path = _saved(tmp_path)
    DAMAGES[damage](path, path.with_suffix(".npz"))
    done = subprocess.run([sys.executable, "-m", "tkverify.cli", "replay", str(path)], capture_output=True,
                          text=True, cwd=Path(__file__).resolve().parent.parent, timeout=120)
    assert done.returncode == 2
    assert done.stdout == "" and "Traceback" not in done.stderr
    assert done.stderr.startswith("tkverify replay: ") and done.stderr.count("\n") == 1, done.stderr


def test_replay_takes_several_case_files_in_one_process(tmp_path, capsys, monkeypatch):
    """Each file gets its verdict and the worst element; the exit status is the worst verdict."""
    monkeypatch.syspath_prepend(str(Path(__file__).parent))  # tests/broken.py: the ties_high topk_gate
    ties = Case(params={"k": 1}, inputs={"scores": torch.ones(2, 5)})
    good = save_case(tmp_path / "good", ties, op="moe.topk_gate", impl="torch")
    bad = save_case(tmp_path / "bad", ties, op="moe.topk_gate", impl="ties_high")
    junk = tmp_path / "junk.json"
    junk.write_text("{}")
    assert cli.main(["replay", str(good), str(bad), str(junk), "--load", "broken"]) == 1
    captured = capsys.readouterr()
    out = captured.out
    assert out.index(f"=== {good}") < out.index("PASS") < out.index(f"=== {bad}") < out.index("FAIL")
    assert "worst at index (0, 0): actual 4, expected 0" in out
    assert "indices (int64" in out and "worst at (0, 0): actual 0, expected 0" in out
    assert f"  PASS        {good}\n  FAIL        {bad}\n  CANNOT RUN  {junk}\n" in out
    assert "junk.npz does not exist" in captured.err
    # Without a failure, a file that cannot run decides; all passing is 0; one file keeps its own status.
    assert cli.main(["replay", str(good), str(junk)]) == 2
    assert cli.main(["replay", str(good), str(good)]) == 0
    assert cli.main(["replay", str(bad), "--load", "broken"]) == 1


def test_replay_goes_on_in_a_fresh_process_once_the_cuda_context_is_lost(tmp_path, capsys, monkeypatch):
    """A device-side assert ends the CUDA context of its process, and every later case would fail with it: the
    cases left after one that lost the context replay in a new process, whose verdict counts."""
    monkeypatch.syspath_prepend(str(Path(__file__).parent))
    ties = Case(params={"k": 1}, inputs={"scores": torch.ones(2, 5)})
    first = save_case(tmp_path / "first", ties, op="moe.topk_gate", impl="torch")
    rest = [save_case(tmp_path / f"rest{i}", ties, op="moe.topk_gate", impl="ties_high") for i in range(2)]
    lost = iter([True])
    monkeypatch.setattr(cli, "cuda_context_lost", lambda: next(lost, False))
    fresh = []
    monkeypatch.setattr(cli, "_replay_in_fresh_process", lambda paths, args: fresh.append(paths) or 1)
    assert cli.main(["replay", str(first), *map(str, rest), "--load", "broken"]) == 1
    out = capsys.readouterr().out
    assert fresh == [[str(p) for p in rest]]  # the two left, in one new process
    assert "the CUDA context was lost in" in out and out.count("=== ") == 1
    assert "FAIL        (2 cases, fresh process: above)" in out
    monkeypatch.undo()
    if not torch.cuda.is_available():
        assert cli.cuda_context_lost() is False  # without CUDA there is no context to lose


def _drawn_layouts() -> dict[str, torch.Tensor]:
    """A row-strided x (a slice of rows twice as wide, NaN padding) and a batch slice (``buf[1:3]``)."""
    g = torch.Generator().manual_seed(1)
    wide = torch.full((4, 12), float("nan"), dtype=torch.bfloat16)
    wide[:, :6] = torch.randn(4, 6, generator=g).to(torch.bfloat16)
    batch = torch.randn(4, 3, 5, generator=g)
    return {"x": wide[:, :6], "b": batch[1:3], "plain": torch.arange(6, dtype=torch.int32).reshape(2, 3)}


def _same_layout_and_bits(got: torch.Tensor, want: torch.Tensor) -> None:
    assert got.dtype == want.dtype and got.shape == want.shape
    assert got.stride() == want.stride() and got.storage_offset() == want.storage_offset()
    assert torch.equal(got.contiguous().view(torch.uint8), want.contiguous().view(torch.uint8))


def test_layouts_survive_the_case_file_and_the_copy_to_a_device(tmp_path):
    inputs = _drawn_layouts()
    assert inputs["x"].stride() == (12, 1) and inputs["b"].storage_offset() == 15
    case = Case({"k": 1}, inputs)
    for name, t in case.to("cpu").items():
        _same_layout_and_bits(t, inputs[name])
        assert t.untyped_storage().data_ptr() != inputs[name].untyped_storage().data_ptr()  # a copy
    moved = case.to("cpu")["x"]
    assert torch.isnan(moved.as_strided((3, 12), (12, 1), 0)[:, 6:]).all()  # the padding between rows too
    path = save_case(tmp_path / "strided", case, op="moe.topk_gate", impl="torch")
    tensors = json.loads(path.read_text())["tensors"]
    assert tensors["x"] == {"dtype": "bfloat16", "shape": [4, 6], "strides": [12, 1], "storage_offset": 0,
                                 "storage_size": 42}
    assert tensors["b"]["storage_offset"] == 15 and "strides" not in tensors["plain"]
    loaded, _ = load_case(path)
    for name, t in loaded.inputs.items():
        _same_layout_and_bits(t, inputs[name])
        _same_layout_and_bits(Case({}, {name: t}).to("cpu")[name], inputs[name])
    padding = loaded.inputs["x"].as_strided((3, 6), (12, 1), 6)
    assert torch.isnan(padding.float()).all()  # the sentinel (0xFF bytes) where nothing was recorded
    assert loaded.inputs["b"].as_strided((15,), (1,), 0).view(torch.int32).eq(-1).all()


def test_a_case_file_without_layouts_loads_contiguous(tmp_path):
    inputs = _drawn_layouts()
    path = save_case(tmp_path / "old", Case({}, inputs), op="moe.topk_gate", impl="torch")
    fields = ("strides", "storage_offset", "storage_size")
    _edit_json(path, lambda meta: [info.pop(f, None) for info in meta["tensors"].values() for f in fields])
    loaded, _ = load_case(path)
    for name, t in loaded.inputs.items():
        assert t.is_contiguous() and t.storage_offset() == 0
        assert torch.equal(t.view(torch.uint8), inputs[name].contiguous().view(torch.uint8))


@pytest.mark.parametrize("record", [{"strides": [1]}, {"strides": [12, -1]}, {"storage_size": 10},
                                    {"storage_offset": "0"}])
def test_a_damaged_layout_record_is_refused(tmp_path, record):
    path = save_case(tmp_path / "c", Case({}, _drawn_layouts()), op="moe.topk_gate", impl="torch")
    _edit_json(path, lambda meta: meta["tensors"]["x"].update(record))
    with pytest.raises(CaseFileError, match="tensor 'x'"):
        load_case(path)


def test_replay_runs_a_strided_case_as_drawn(tmp_path, capsys):
    wide = torch.full((5, 9), float("nan"))
    wide[:, :4] = torch.arange(20, dtype=torch.float32).reshape(5, 4)
    path = save_case(tmp_path / "t", Case({}, {"x": wide[:, :4]}), op="transpose.transpose", impl="torch")
    assert cli.main(["replay", str(path)]) == 0
    out = capsys.readouterr().out
    assert "x=(5, 4):float32 strides (9, 1) offset 0" in out and "PASS" in out


def test_resized_tiles_values_along_the_named_axes():
    x = torch.arange(6, dtype=torch.float32).reshape(2, 3)
    case = Case({"k": 1}, {"x": x, "y": torch.ones(4)})
    grown = case.resized([("x", -1)], 7)
    assert grown.inputs["x"].tolist() == [[0, 1, 2, 0, 1, 2, 0], [3, 4, 5, 3, 4, 5, 3]]
    assert grown.inputs["y"] is case.inputs["y"] and grown.params == {"k": 1}
    assert case.resized([("x", 0), ("y", 0)], 1).inputs["y"].tolist() == [1.0]
    assert case.resized([("x", 1)], 0).inputs["x"].shape == (2, 0)
    assert case.resized([("x", 0), ("x", 1)], 4).inputs["x"].tolist() == [[0, 1, 2, 0], [3, 4, 5, 3]] * 2
    with pytest.raises(KeyError, match="no tensor 'z'"):
        case.resized([("z", 0)], 2)
    with pytest.raises(ValueError, match="nothing to repeat"):
        Case({}, {"x": torch.ones(0, 2)}).resized([("x", 0)], 3)


def test_replay_resize_finds_the_size_where_a_failure_begins(tmp_path, capsys, monkeypatch):
    """ties_high breaks ties among the scores of a row; one expert has none, so only the wider rows fail."""
    monkeypatch.syspath_prepend(str(Path(__file__).parent))  # tests/broken.py: the ties_high topk_gate
    bad = save_case(tmp_path / "bad", Case({"k": 1}, {"scores": torch.ones(2, 5)}), op="moe.topk_gate",
                    impl="ties_high")
    assert cli.main(["replay", str(bad), "--load", "broken", "--resize", "scores:1", "--sizes", "1,5"]) == 1
    out = capsys.readouterr().out
    assert "=== scores:1 = 1" in out and "scores=(2, 1):float32" in out
    assert out.endswith("  PASS        1\n  FAIL        5\n"), out
    assert cli.main(["replay", str(bad), "--load", "broken", "--resize", "scores:1", "--sizes", "1"]) == 0
    assert cli.main(["replay", str(bad), str(bad), "--resize", "scores:1", "--sizes", "1"]) == 2
    with pytest.raises(SystemExit):
        cli.main(["replay", str(bad), "--resize", "scores", "--sizes", "1"])
