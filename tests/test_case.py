"""Case files: round trips of every dtype, and clear errors on damaged files."""

import json

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


@pytest.mark.parametrize("damage", ["truncate_npz", "garbage_json", "not_ours", "missing_npz", "wrong_size"])
def test_damaged_case_files_give_clear_errors(tmp_path, damage, capsys):
    path = _saved(tmp_path)
    npz = path.with_suffix(".npz")
    if damage == "truncate_npz":
        npz.write_bytes(npz.read_bytes()[:40])
    elif damage == "garbage_json":
        path.write_text("{not json")
    elif damage == "not_ours":
        path.write_text(json.dumps({"hello": 1}))
    elif damage == "missing_npz":
        npz.unlink()
    elif damage == "wrong_size":
        meta = json.loads(path.read_text())
        meta["tensors"]["scores"]["shape"] = [3, 4]
        path.write_text(json.dumps(meta))
    with pytest.raises(CaseFileError):
        load_case(path)
    assert cli.main(["replay", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("tkverify replay: ") and str(tmp_path) in err
