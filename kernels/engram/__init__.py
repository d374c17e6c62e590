"""Engram in TileLang: the gate's forward and backward, the grad_w reduction, fused_weight and the n-gram hash.

What each op computes is ``docs/contract/engram.md``; signatures, return conventions and argument
checks are those of ``kernels/torch/engram.py`` (its checks are called here, so the same bad arguments
raise the same errors), in working precision only: x, k, v (and grad_out) bf16, w and the saved d, g,
rx, rk fp32.  How the outputs are judged: ``tkverify/specs/engram.py``.

Where things are:

=====================  ==========================================================================
``configs``            constants, ``GateConfig`` and its static configurations, the tuning
                       candidates and the *_SHIPPED / *_OVERRIDES tables, and which
                       configuration and grid a call gets (``fwd_config``, ``bwd_config``,
                       ``forward_tokens_per_block``, ``backward_blocks``)
``macros``             the TIR both gate kernels share: bf16 unpacking, the CTA reduction, the
                       cp.async ring (and the row layout they rely on)
``gate_fwd``           the forward kernel ``GATE_FWD`` (engram.gate_fwd)
``gate_bwd``           the backward kernel ``GATE_BWD`` (engram.gate_bwd): grad_x, grad_k,
                       grad_v and per-block grad_w partials
``grad_w_reduce``      ``GRAD_W_REDUCE``: the partials summed in a fixed order, into grad_w (the gate
                       backward) or, fused, into both weights' accumulators (engram.grad_w_reduce)
``fused_weight``       ``FUSED_WEIGHT`` (engram.fused_weight): weight_hidden * weight_embed in fp32
``hash``               ``ENGRAM_HASH`` (engram.hash): the n-gram hash embedding indices
``wrappers``           the entry points ``engram_gate_fwd``, ``engram_gate_bwd``, ``EngramGate``,
                       ``engram_gate``, ``fused_weight``, ``grad_w_reduce``, ``engram_hash``: checks,
                       configuration, launches
=====================  ==========================================================================

No fast math: tilelang compiles without --use_fast_math, so sqrtf and the division are IEEE, expf is
libdevice's, subnormals are kept; rsqrtf is rsqrt.approx (within the spec's 2^-20).  nvcc may contract
a * b + c into an FMA, which rounds once instead of twice and stays inside the spec's intervals.
Every global access is guarded by hand (tilelang's safe-memory legalisation is disabled, as in the
other families).

The tables (``FWD_OVERRIDES``, ``BWD_OVERRIDES``, ...) are re-exported here as the same dict objects, so
a tuning run fills them through this package; a module-level number such as ``configs.BWD_BLOCKS`` is
read from ``configs``, where a reassignment has to go.
"""

from .configs import (BWD_BLOCKS, BWD_OVERRIDES, BWD_RING_MAX_THREADS, BWD_SHIPPED, BWD_STAGES, BWD_TUNE_CONFIGS,
                      CHUNK, FWD_OVERRIDES, FWD_RESIDENT, FWD_SHIPPED, FWD_STAGES, FWD_TUNE_CONFIGS, FWD_WAVES,
                      GATE_CONFIGS, MAX_HEADS, MAX_HIDDEN, MAX_SHARED_PER_CTA, PASS_CONFIGS, THREAD_COUNTS, WARP,
                      WORDS, GateConfig, _bwd_shared_bytes, _fwd_shared_bytes, backward_blocks, bwd_config,
                      config_for_hidden, forward_tokens_per_block, fwd_config, fwd_resident, row_chunks)
from .gate_bwd import GATE_BWD, build_gate_bwd
from .gate_fwd import GATE_FWD, build_gate_fwd
from .grad_w_reduce import (GRAD_W_REDUCE, REDUCE_COLUMNS, REDUCE_CONFIGS, REDUCE_THREADS, REDUCE_WARPS, ReduceConfig,
                            build_grad_w_reduce)
from .fused_weight import FUSED_WEIGHT, FUSED_WEIGHT_CONFIGS, FusedWeightConfig, build_fused_weight
from .hash import ENGRAM_HASH, HASH_CONFIGS, HashConfig, build_engram_hash
from .wrappers import (EngramGate, engram_gate, engram_gate_bwd, engram_gate_fwd, engram_hash, fused_weight,
                       grad_w_reduce)
