"""mHC kernels in TileLang: Sinkhorn normalisation (forward and backward), the three mix ops, and the
backward passes of the three mix ops.

What each op computes is ``docs/contract/mhc.md``; Sinkhorn's signatures and checks are those of
``kernels/torch/mhc.py`` (fp32 only here), the mix ops' are its ``pre_split_mixes``, ``pre_apply_mix``,
``post`` and their backward passes (``pre_split_mixes_bwd``, ``pre_apply_mix_bwd``, ``post_bwd``).  Every
public function checks its arguments (TypeError / ValueError naming the argument) before anything is
launched; an empty batch returns an empty result without a launch.  How the outputs
are judged: ``tkverify/specs/mhc.py``.

Where things are:

=====================  ==========================================================================
``sinkhorn_kernels``   ``SINKHORN`` and ``SINKHORN_BWD`` (mhc.sinkhorn, mhc.sinkhorn_bwd), their
                       wrappers ``sinkhorn``, ``sinkhorn_bwd`` and the autograd Function ``Sinkhorn``
``split_mixes``        ``PRE_SPLIT_MIXES`` (mhc.pre_split_mixes) and ``pre_split_mixes``
``split_mixes_bwd``    ``PRE_SPLIT_MIXES_BWD`` (mhc.pre_split_mixes_bwd), ``SplitBwdConfig`` and
                       ``pre_split_mixes_bwd``
``apply_mix``          ``PRE_APPLY_MIX`` (mhc.pre_apply_mix) and ``pre_apply_mix``
``apply_mix_bwd``      ``PRE_APPLY_MIX_BWD`` (mhc.pre_apply_mix_bwd), ``pre_apply_mix_bwd``, and
                       the CTA sum of the backward kernels' per-token sums
``post_mix``           ``POST`` (mhc.post), ``PostConfig`` and its tuning tables, and ``post``
``post_bwd``           ``POST_BWD`` (mhc.post_bwd), ``PostBwdConfig`` and ``post_bwd``
``shared``             the contract's limits, the pass configuration, the CUDA prelude, and the
                       checks the mix ops share
=====================  ==========================================================================

All global accesses are guarded by hand (tilelang's safe-memory legalisation is off, as in the other
families: it would add per-lane checks that block vectorisation).  Launches are cut into pieces so that
flat int32 indices and grid sizes stay in range.

``POST_OVERRIDES`` is re-exported here as the same dict object, so a tuning run fills it through this
package.
"""

from .apply_mix import MIX_CONFIGS, PRE_APPLY_MIX, MixConfig, build_pre_apply_mix, pre_apply_mix
from .apply_mix_bwd import PRE_APPLY_MIX_BWD, build_pre_apply_mix_bwd, pre_apply_mix_bwd
from .post_bwd import POST_BWD, POST_BWD_CONFIGS, PostBwdConfig, build_post_bwd, post_bwd
from .post_mix import POST, POST_CONFIGS, POST_OVERRIDES, POST_TUNE_CONFIGS, PostConfig, build_post, post, post_config
from .shared import DEFAULT_EPS, DEFAULT_REPEAT, MAX_M, MIN_M, MIX_THREADS, MIX_VECTOR, PASS_CONFIGS, PRELUDE
from .sinkhorn_kernels import (BWD_THREADS, CHECKPOINTS, EXACT_DIVISION_BELOW, FWD_THREADS, MAX_MATRICES_PER_LAUNCH,
                               MAX_REPEAT, SINKHORN, SINKHORN_BWD, SINKHORN_CONFIGS, SINKHORN_PASS_CONFIGS, Sinkhorn,
                               SinkhornConfig, build_sinkhorn, build_sinkhorn_bwd, checkpoint_interval, sinkhorn,
                               sinkhorn_bwd)
from .split_mixes import (ELEMENTWISE_THREADS, PRE_SPLIT_MIXES, SPLIT_CONFIGS, SplitConfig, build_pre_split_mixes,
                          pre_split_mixes)
from .split_mixes_bwd import (PRE_SPLIT_MIXES_BWD, SPLIT_BWD_CONFIGS, SplitBwdConfig, build_pre_split_mixes_bwd,
                              pre_split_mixes_bwd)
