#!/usr/bin/env bash
# What a GPU run of tkverify does on the H200 (through the device tool):
#   TKVERIFY_COMMIT=<hash> STEPS="precompile pytest report bench" bash scripts/gpu-run.sh [pytest -k expression]
# STEPS (default: all of them) picks among: precompile pytest report bench profile tune mutants memcheck.
# TK_IMPL (default all) is pytest's --tk-impl; MUTANT_IMPLS (default "tilelang torch"); MEMCHECK_SECONDS, RACECHECK_SECONDS.
# WORKERS (default 8) sets pytest -n; SEED passes --hypothesis-seed (the ci profile then draws other examples).
# Everything it produces is packed into $OUT/results.tar.gz (the tool brings back few files).
set -uo pipefail
source .gpu/setup.sh main || exit 1  # (a bare source would pass this script's arguments on)
export PYTHONUNBUFFERED=1 TILELANG_CACHE_DIR="$PWD/.cache/tilelang"
R="${OUT:-/tmp/out}/results"; mkdir -p "$R"
select="${1:-}"
STEPS="${STEPS:-precompile pytest report bench profile mutants memcheck}"

# The pytest11 entry point and the console script need an install; without one, name the plugin.
if ! python3 -m pip install -q --no-deps --no-index --no-build-isolation -e . >"$R/install.log" 2>&1; then
  export PYTEST_ADDOPTS="-p tkverify.plugin"
fi
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv | tee "$R/gpu.txt"
python3 -c "import torch, tilelang; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'tilelang', tilelang.__version__)" | tee -a "$R/gpu.txt"

source scripts/steps.sh

wants precompile && step precompile python3 -m kernels.precompile
if wants pytest; then
  # GPU utilisation once a second while the suite runs, and each worker's own account of its GPU.
  nvidia-smi --query-gpu=timestamp,index,utilization.gpu,memory.used --format=csv,noheader -lms 1000 \
    >"$R/gpu-util.csv" 2>/dev/null & util=$!
  step pytest python3 -m pytest -n "${WORKERS:-8}" --tk-impl "${TK_IMPL:-all}" --tk-profile ci --tk-report="$R/pytest-report" \
    -p no:cacheprovider ${SEED:+--hypothesis-seed="$SEED"} ${select:+-k "$select"}
  kill "$util" 2>/dev/null
  step shards python3 -m tkverify.cli shards "$R/pytest-report"
fi
wants report && step report python3 -m tkverify.cli report --impl tilelang --profile ci --out "$R/report-tilelang" -n 8 \
  ${select:+-k "$select"}
# Every op's declared benchmark shapes (tkverify/specs), tile-kernels included where it is installed.
wants bench && step bench python3 -m tkverify.cli bench --out "$R/bench"
# Host time per call of the TileLang wrappers (what eager callers pay beyond the kernel).
wants profile && step profile python3 scripts/profile_host.py -k per_token_cast,swiglu,expand_to_fused,transpose,engram,sinkhorn
# Candidate static configurations of the per-token cast kernel, bitwise-checked against the shipped one.
wants tune && step tune python3 -m benchmarks.tune "$R/tune.json"
if wants mutants; then
  step mutants-tilelang python3 -m tkverify.cli mutants --impl tilelang --profile ci --out "$R/mutants-tilelang"
  [[ "${MUTANT_IMPLS:-tilelang torch}" == *torch* ]] && \
    step mutants-torch-cuda python3 -m tkverify.cli mutants --impl torch --profile ci --out "$R/mutants-torch-cuda"
fi
# Memory safety of the TileLang kernels on their GPU tests (bounded: the sanitizer is slow).
if wants memcheck; then
  step memcheck timeout "${MEMCHECK_SECONDS:-200}" compute-sanitizer --tool memcheck --error-exitcode 99 \
    python3 -m pytest -p no:cacheprovider -q -x tests/test_moe_kernels_gpu.py tests/test_engram_kernels_gpu.py \
    tests/test_mhc_kernels_gpu.py tests/test_regressions.py
  # Shared-memory races in the kernels that stage through shared memory (Sinkhorn, Engram backward).
  step racecheck timeout "${RACECHECK_SECONDS:-90}" compute-sanitizer --tool racecheck --error-exitcode 99 \
    python3 -m pytest -p no:cacheprovider -q -x tests/test_mhc_kernels_gpu.py tests/test_engram_kernels_gpu.py \
    -k "sinkhorn_within_bounds or autograd or reproducible"
fi
cp -r .tkverify/cases "$R/cases" 2>/dev/null
tar -C "$PWD/.cache" -cJf "$R/tilelang-cache.tar.xz" tilelang
tar -C "$(dirname "$R")" -czf "${OUT:-/tmp/out}/results.tar.gz" results && rm -rf "$R"
