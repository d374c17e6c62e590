"""expand_to_fused's static configurations, its tuning candidates, and the configuration a call launches.

A configuration names one of the op's kernels (`stage`: the map, row, order, gather or sf-column kernel)
and its geometry.  The row kernel's base configuration for a unit width is ExpandConfig("rows", width);
EXPAND_SHIPPED puts a faster kernel with the same bits in place of a base configuration, and a tuning
run may put any configuration of the same stage and width there (EXPAND_OVERRIDES).  `expand_rows_config`
applies both tables.
"""

from typing import NamedTuple

import torch

from .. import _tilelang

EXPAND_THREADS = 128
PAD_ROWS = 32  # rows checked (and zeroed if no pair reaches them) per padding block
EXPAND_UNITS = (16, 4, 2, 1)  # bytes moved per thread access
# The raw integer each unit width moves, in the kernels and on the host (16 bytes move as 4 int32).
RAW_DTYPES = {1: "uint8", 2: "int16", 4: "int32"}
RAW_TORCH_DTYPES = {1: torch.uint8, 2: torch.int16, 4: torch.int32}


class ExpandConfig(NamedTuple):
    stage: str  # "map", "rows", "order", "gather" or "sf_columns"
    width: int  # rows, gather: bytes per unit (16, 4, 2, 1; gather 16); sf_columns: sf element bytes (4, 1); else 0
    # Tuning knobs of the row and gather kernels (the defaults are the base row kernel; see EXPAND_TUNE_CONFIGS):
    threads: int = EXPAND_THREADS  # threads of a CTA
    units: int = 1  # units a thread loads (all in flight) before it stores them: a tile is threads * units
    # rows: out (rows and padding zeros) stored with st.global.cs (16-byte units only);
    # gather: x loaded with L2 evict_last and out stored with L2 evict_first hints
    streaming: bool = False
    pad_rows: int = PAD_ROWS  # gather: rows a padding block checks (the row kernels check PAD_ROWS)


EXPAND_CONFIGS = (
    (ExpandConfig("map", 0), ExpandConfig("order", 0))
    + tuple(ExpandConfig("rows", unit) for unit in EXPAND_UNITS)
    + tuple(ExpandConfig("sf_columns", width) for width in (4, 1))
)

# Candidates benchmarks/tune.py times against the shipped configuration (the bench's T 16384, K 8,
# H 7168 bf16: rows of 896 units, a write-bound scatter, 1 byte read for 9 moved).
# Bitwise equal by construction: every out byte is one x byte or a padding zero, whoever stores it.
EXPAND_TUNE_CONFIGS = (
    # 2 loads in flight a thread and half the CTAs (a tile of 256 units)
    ExpandConfig("rows", 16, units=2),
    # one CTA a whole row (1024-unit tile >= 896): 4 loads in flight, 1/7 the CTAs, and each CTA
    # writes its K rows of 14 KiB start to end (long DRAM write runs, fewer CTA launches)
    ExpandConfig("rows", 16, threads=256, units=4),
    # out is written once and never read here: evict-first stores leave L2 to the write-back stream
    ExpandConfig("rows", 16, streaming=True),
    ExpandConfig("rows", 16, threads=256, units=4, streaming=True),
    # one unit a thread and a whole 896-unit row a CTA: the positions read and the barrier paid once a
    # row instead of 7 times
    ExpandConfig("rows", 16, threads=896),
    ExpandConfig("rows", 16, threads=896, streaming=True),
    # half a row a CTA, 2 units a thread in flight
    ExpandConfig("rows", 16, threads=448, units=2),
    # 2 units a thread with evict-first stores
    ExpandConfig("rows", 16, units=2, streaming=True),
    # The gather (kernels/moe/expand_gather.py): a CTA a destination row in position-bucket order, with
    # its L2 hints and without them
    ExpandConfig("gather", 16, threads=128, units=7, streaming=True),
    ExpandConfig("gather", 16, threads=128, units=7),
    # padding blocks of 8, 4 or 16 rows: a block of 32 padding rows stores 448 KiB from 128 threads
    ExpandConfig("gather", 16, threads=128, units=7, streaming=True, pad_rows=8),
    ExpandConfig("gather", 16, threads=128, units=7, streaming=True, pad_rows=4),
    ExpandConfig("gather", 16, threads=128, units=7, streaming=True, pad_rows=16),
)
# The row kernel ships a tuning candidate where one is faster with the same bits: the base configuration
# of a unit -> the one launched.  16-byte units: the gather with L2 hints and padding blocks of 8 rows.
# At the bench shape its three kernels take 593.4 us of device time against 625.9 us for the row kernel
# of 2 units a thread, and 612.5 us with padding blocks of 32 rows (106 registers a thread against 48),
# every byte equal (reports/evidence/moe.md#expand-gather).
EXPAND_SHIPPED: dict[ExpandConfig, ExpandConfig] = {
    ExpandConfig("rows", 16): ExpandConfig("gather", 16, threads=128, units=7, streaming=True, pad_rows=8)}
# The base configuration -> the configuration to use instead (any of EXPAND_TO_FUSED.configs with
# the same stage and width), set by a tuning run.
EXPAND_OVERRIDES: dict[ExpandConfig, ExpandConfig] = {}


def expand_rows_config(unit: int) -> ExpandConfig:
    """The row kernel's configuration for `unit`: the shipped one (EXPAND_SHIPPED's, else the base kernel),
    unless a tuning run overrides it (EXPAND_OVERRIDES, keyed by the base configuration)."""
    return _tilelang.chosen_config(ExpandConfig("rows", unit), EXPAND_SHIPPED, EXPAND_OVERRIDES)
