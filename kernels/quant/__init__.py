"""Quantisation kernels in TileLang: per-token, per-block and per-channel casts to e4m3 / e2m1 /
e5m6 with block scale factors, cast_back, and SwiGLU fused with a per-token cast.

What each op computes, its edge semantics and its number formats: docs/contract/quant.md.  The
wrappers have the signatures, argument checks (the same TypeError / ValueError, naming the
argument: they call kernels/torch/quant.py's check functions), return conventions and layouts of
``kernels/torch/quant.py``; how outputs are judged is ``tkverify/specs/quant.py``.  In addition
every tensor must be on one CUDA device and every dimension fit an int32.

Three kernels (quant.token_cast, quant.block_cast, quant.cast_back), each with its static
configurations (everything else is a runtime argument), in these modules:

==================  =====================================================================
``token_kernel``    kernel quant.token_cast: the per-token casts and SwiGLU + cast, its
                    fast, row and generic paths, and their tuning candidates
``token_cast``      per_token_cast, per_token_cast_with_sf_only,
                    per_token_cast_with_precomputed_sf: path choice and launches
``swiglu``          swiglu_forward_and_per_token_cast: the same kernel, source swiglu
``block_cast``      kernel quant.block_cast, per_block_cast (and its sf-only and precomputed-sf
                    forms) and per_channel_cast
``dequant``         kernel quant.cast_back and cast_back: codes times sf, back to bf16 / fp32
``scale``           amax, sf (plain and round_sf), the ue8m0 byte, sf storage and layouts
``encode``          the element encoders: e2m1 and e5m6 codes of an fp32 quotient
``prelude``         the device helpers before every kernel (e4m3 conversion, NaN min / max)
``common``          constants, TIR bit helpers, multiply-shift division, host storage
==================  =====================================================================

The shared modules (``scale``, ``encode``, ``prelude``, ``common``) import none of the kernel
modules above them.  TileLang itself is imported lazily (``kernels._tilelang.T()``), so importing
this package never imports tilelang.

The names below are the package's interface: the nine ops (``kernels.quant:NAME`` in
tkverify/specs/quant.py), the KernelDefs ``kernels.KERNELS`` lists, and the configurations and
override tables that benchmarks/tune.py and the GPU tests use.  A test that reassigns a
module-level value patches the module that reads it (``kernels.quant.block_cast``, say), not
this package.
"""

from .block_cast import (BLOCK_CAST, BLOCK_CONFIGS, BLOCK_MAX_ELEMENTS_PER_LAUNCH, BLOCK_OVERRIDES, BLOCK_TILE_ROWS,
                         BLOCK_TUNE_CONFIGS, BlockConfig, _block_vectors, block_config, block_geometry,
                         build_block_cast, per_block_cast, per_block_cast_with_precomputed_sf,
                         per_block_cast_with_sf_only, per_channel_cast)
from .common import CHUNK, FORMATS, MAX_Q, WARP, magic_divisor
from .dequant import (BACK_MAX_ELEMENTS, CAST_BACK, CAST_BACK_CONFIGS, CAST_BACK_OVERRIDES, CAST_BACK_TUNE_CONFIGS,
                      CastBackConfig, build_cast_back, cast_back)
from .encode import _e5m6_code, _e5m6_code_fast
from .swiglu import swiglu_forward_and_per_token_cast
from .token_cast import (MAX_CHUNKS_PER_LAUNCH, _generic_geometry, _token_geometry, per_token_cast,
                         per_token_cast_with_precomputed_sf, per_token_cast_with_sf_only)
from .token_kernel import (ROW_PATH, TOKEN_CAST, TOKEN_CONFIGS, TOKEN_OVERRIDES, TOKEN_TUNE_CONFIGS, TUNED,
                           TokenConfig, build_token_cast, fast_paths, row_chunks, token_config)
