"""Write the hand-made case files of reports/tile-kernels/findings.md.

    python3 scripts/tile-kernels-findings-cases.py   # rewrites the hand-made files of reports/tile-kernels/2.1.0/cases/

Each is the smallest input that shows one finding; its "finding" entry says which, and what
tile-kernels 2.1.0 is expected to return there (read from its source; a replay on a GPU with
tile-kernels installed, `scripts/gpu-run.sh --tile-kernels 2.1.0 --steps findings`, confirms or
refutes it).  The cases that fuzz runs saved and shrank lie beside them as they came; this script
leaves those alone.  The inputs come from a seeded generator, so a rerun writes the same tensors
(the .npz files) and only the versions recorded in the .json files change.  The cases that
tests/test_tile_kernels_known.py names are copied to tests/data/tile_kernels/ by hand.
"""

from __future__ import annotations

from pathlib import Path

import torch

from tkverify.case import Case, save_case

OUT = Path(__file__).resolve().parent.parent / "reports" / "tile-kernels" / "2.1.0" / "cases"
GEN = torch.Generator().manual_seed(7)


def row(n: int, dtype=torch.float32) -> torch.Tensor:
    return (torch.randn(1, n, generator=GEN) * 3).to(dtype)


def cast_params(fmt: str, npc: int, round_sf: bool = False, ue8m0: bool = False) -> dict:
    return {"fmt": fmt, "num_per_channels": npc, "round_sf": round_sf or ue8m0, "use_ue8m0": ue8m0,
            "use_packed_ue8m0": False, "use_tma_aligned_col_major_sf": False, "clamp_min": None}


def write(name: str, op: str, params: dict, inputs: dict, finding: str, raw: bool = False) -> None:
    where = OUT / "raw" if raw else OUT
    save_case(where / name, Case(params=params, inputs=inputs), op=op, impl="tile_kernels",
              extra={"finding": finding})


def main() -> None:
    # F1: a NaN in a block; e2m1 has no NaN code, so the NaN element itself becomes a number.
    x = row(64, torch.bfloat16)
    x[0, 3] = float("nan")
    write("quant.per_token_cast-F1-nan-e2m1", "quant.per_token_cast", cast_params("e2m1", 16), {"x": x},
          "F1: block 0 holds a NaN. Contract: sf NaN. Expected from 2.1.0: its absmax skips the NaN, so sf is "
          "the other 15 elements' (finite); the NaN element is cast to e2m1, which has no NaN: a finite code.")
    # F2: an infinity in a block with round_sf: its sf reciprocal is built from exponent bits.
    x = row(64)
    x[0, 0] = float("inf")
    write("quant.per_token_cast-F2-inf-round_sf", "quant.per_token_cast", cast_params("e4m3", 64, round_sf=True),
          {"x": x}, "F2: the block holds +inf. Contract: sf NaN, every element NaN. Expected from 2.1.0: sf = +inf "
          "and 1/sf = -inf (exponent 128 in 127 - e wraps into the sign bit), so every finite element is "
          "saturated to -sign(x) * 448 and +inf to -448: the block dequantises to infinities of flipped sign.")
    write("quant.per_token_cast-F2-inf-ue8m0", "quant.per_token_cast", cast_params("e4m3", 64, ue8m0=True),
          {"x": x}, "F2 with ue8m0: the sf byte 0xFF is NaN (as the contract says); the data are still "
          "-sign(x) * 448 (judged given sf NaN: every element must be NaN).")
    write("quant.per_token_cast-F2-inf-plain", "quant.per_token_cast", cast_params("e4m3", 64), {"x": x},
          "F2 without round_sf: sf = inf / 448 = +inf where the contract says NaN; 1/sf = 0, so the data are "
          "+-0 (inf * 0 = NaN for the infinity): the block still dequantises to NaN (0 * inf).")
    # F3: a precomputed sf whose reciprocal overflows fp32.
    x = row(64, torch.bfloat16)
    x[0, :16] = 0.0
    sf = torch.tensor([[8 * 2.0**-149, 0.01, 0.01, 0.01]], dtype=torch.float32)
    write("quant.per_token_cast_with_precomputed_sf-F3-subnormal-sf-e4m3", "quant.per_token_cast_with_precomputed_sf",
          {"fmt": "e4m3", "num_per_channels": 16}, {"x": x, "sf": sf},
          "F3: block 0 is all zeros with sf 8 * 2^-149 (subnormal). Contract: 0 / sf = 0. Expected from 2.1.0: "
          "1 / sf overflows to inf and 0 * inf = NaN: NaN codes from finite inputs.")
    # F5: sinkhorn sizes: m not a power of two (refused by the adapter; raw replays call it anyway).
    for m in (3, 5, 6):
        write(f"mhc.sinkhorn-F5-m{m}", "mhc.sinkhorn", {"repeat": 2, "eps": 1e-6},
              {"x": torch.randn(2, m, m, generator=GEN)},
              f"F5: m = {m}. Adapter: Unsupported (m not a power of two). Replayed with TKVERIFY_TK_RAW=1: "
              "expected a TileLang compile error (2.1.0 seen at m = 3 and 5).", raw=True)
    write("mhc.sinkhorn-F5-m8", "mhc.sinkhorn", {"repeat": 3, "eps": 1e-6}, {"x": torch.randn(2, 8, 8, generator=GEN)},
          "F5: m = 8, a power of two: expected to compile and pass.")
    # Probes: an empty batch for engram.gate (forward and backward) and the unrouted SwiGLU cast with a NaN.
    hc, hidden = 4, 512
    empty = {"x": torch.zeros(0, hc, hidden, dtype=torch.bfloat16), "k": torch.zeros(0, hc, hidden, dtype=torch.bfloat16),
             "v": torch.zeros(0, hidden, dtype=torch.bfloat16), "w": torch.randn(hc, hidden, generator=GEN)}
    write("engram.gate-P1-empty-batch", "engram.gate", {"eps": 1e-6, "clamp": 1e-6}, empty,
          "Probe: T = 0 at a size it takes (hc 4, H 512). Contract: empty outputs.")
    save_case(OUT / "engram.gate-P1-empty-batch-gradients", Case({"eps": 1e-6, "clamp": 1e-6}, empty),
              op="engram.gate", impl="tile_kernels",
              extra={"gradient": {"seed": 0, "precision": "auto"}, "finding": "Probe: backward at T = 0."})
    x = (torch.randn(4, 512, generator=GEN) * 4).to(torch.bfloat16)
    x[1, 7] = float("nan")
    write("quant.swiglu_forward_and_per_token_cast-P2-plain", "quant.swiglu_forward_and_per_token_cast",
          cast_params("e4m3", 128), {"x": x},
          "Probe: the newly mapped swiglu (no weights, no clamp), with a NaN in row 1's l half.")
    # F12's controls: pre_split_mixes at each m with post_mult 2, two tokens (post_mult 0 is what fails).
    for m in (3, 5, 6, 8):
        width = m * (m + 2)
        write(f"mhc.pre_split_mixes-F12-m{m}", "mhc.pre_split_mixes", {"m": m, "post_mult": 2.0, "pre_eps": 1e-6},
              {"mixes": torch.randn(1, 2, width, generator=GEN), "scale": torch.rand(3, generator=GEN) + 0.5,
               "base": torch.randn(width, generator=GEN)},
              f"F12: m = {m}, two tokens. Expected from 2.1.0: " + (
                  "compiles and passes (a power of two)." if m == 8 else
                  "a TileLang compile error, as its run at m = 5 raised (no available layout found)."))
    # F12's controls with one token at each m, and three at m = 5 (a saved case with one token and
    # post_mult 0 fails), each meant to be replayed in a process of its own (a compile failure earlier
    # in the same process must not be what fails it).
    for m, tokens in ((3, 1), (4, 1), (5, 1), (5, 3), (6, 1), (8, 1)):
        width = m * (m + 2)
        write(f"mhc.pre_split_mixes-F12-m{m}-t{tokens}", "mhc.pre_split_mixes",
              {"m": m, "post_mult": 2.0, "pre_eps": 1e-6},
              {"mixes": torch.randn(1, tokens, width, generator=GEN), "scale": torch.rand(3, generator=GEN) + 0.5,
               "base": torch.randn(width, generator=GEN)},
              f"F12 control: m = {m}, {tokens} token(s), post_mult 2: expected to compile and pass (a saved case "
              "with m = 5, one token and post_mult 0 fails to compile: no available layout found).")
    cast_back_double_rounding()


def cast_back_double_rounding() -> None:
    """F14: q * sf rounded to fp32, then to bf16: each row's q * sf lies just past a bf16 tie, and its fp32
    rounding lands on the tie, which then rounds to even, the other way (values found by a search over e4m3
    codes and fp32 sf near bf16 ties)."""
    pairs = ((0.234375, 4.616666793823242), (352.0, 0.008278586901724339), (3.75, 0.9979166388511658))
    data = torch.zeros(len(pairs), 128)
    data[:, 5] = torch.tensor([q for q, _ in pairs])
    sf = torch.tensor([[s] for _, s in pairs], dtype=torch.float32)
    write("quant.cast_back-F14-double-rounding", "quant.cast_back",
          {"fmt": "e4m3", "block": [1, 128], "out_dtype": "bf16"},
          {"data": data.to(torch.float8_e4m3fn), "sf": sf},
          "F14: column 5 of each row holds q with its row's sf such that q * sf (exact) rounds to bf16 "
          "1.0859375, 2.921875 and 3.734375, but q * sf rounded to fp32 is a bf16 tie that rounds to 1.078125, "
          "2.90625 and 3.75. Contract: one rounding. Seen at the bench shape (T 16384, H 7168, e4m3/128 -> bf16) "
          "on the H200: 749 of 117,440,512 elements of tile-kernels 2.1.0 off by one bf16 code this way.")


if __name__ == "__main__":
    main()
