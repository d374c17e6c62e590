#!/usr/bin/env bash
# What a GPU run of tkverify does on the H200 (through the device tool):
#   TKVERIFY_COMMIT=<hash> STEPS="precompile pytest report bench" bash scripts/gpu-run.sh [pytest -k expression]
# (the hash literally: the device's copy of .git may be older than the tree it runs)
# STEPS (default: all of them but seeds/replay/fuzz/probe) picks among: precompile pytest report bench probe profile tune
# mutants memcheck racecheck seeds replay fuzz fuzz-tk suite.  "|" splits STEPS into groups that run side by side (one GPU,
# 16 cores: the suite is host-bound), e.g. STEPS="precompile pytest | mutants memcheck | seeds"; a group
# that starts with @N sees only GPU N (CUDA_VISIBLE_DEVICES), e.g. STEPS="@0 bench | @1 report".
# "suite" times `pytest --pyargs tkverify.suite` once per worker count in SUITE_WORKERS (default 2),
# over the GPUs the group sees (a count written N@GPUS, e.g. "4 2@0 4@0": over those only), one run after
# another, with the GPUs' utilisation logged beside it (SUITE_TARGET=tests: the whole project suite
# instead; SUITE_IMPL, default torch,tilelang).
# Env: PROBE_OPS (gpu-probe.sh's ops), PROBE_SECONDS; TUNE_K picks tune groups by name; TK_IMPL (default all) is pytest's --tk-impl; WORKERS (default 8) pytest -n; SEED passes
# --hypothesis-seed (the ci profile then draws other examples); SEEDS="1 2 ..." runs tkverify.suite once
# per seed (SEED_WORKERS each, --tk-impl SEED_IMPL, default torch,tilelang); MUTANT_IMPLS (default "tilelang torch"); MEMCHECK_SECONDS, MEMCHECK_TESTS, MEMCHECK_K,
# RACECHECK_SECONDS, RACECHECK_TESTS, RACECHECK_K; REPLAY (case files for `tkverify replay --impl
# tile_kernels`, REPLAY_RAW likewise with TKVERIFY_TK_RAW=1, REPLAY_EACH one process a case, each capped at
# REPLAY_SECONDS); fuzz: FUZZ_IMPL, FUZZ_EXAMPLES, FUZZ_SECONDS, FUZZ_WORKERS; fuzz-tk: FUZZ_TK_EXAMPLES, FUZZ_TK_SECONDS, FUZZ_TK_WORKERS.
# Caches: .cache/tilelang.tar.xz (ours) and .cache/tilelang-main.tar.xz (tile-kernels' JIT) are unpacked
# when carried; both come back under results/ (the tool brings back few files: one tarball).
set -uo pipefail
source .gpu/setup.sh main || exit 1  # (a bare source would pass this script's arguments on)
export PYTHONUNBUFFERED=1 TILELANG_CACHE_DIR="$PWD/.cache/tilelang"
R="${OUT:-/tmp/out}/results"; rm -rf "$R"; mkdir -p "$R"  # a results folder left by an earlier call is not ours
select="${1:-}"
STEPS="${STEPS:-precompile pytest report bench profile mutants memcheck racecheck}"
for c in tilelang tilelang-main; do
  [ -f ".cache/$c.tar.xz" ] && [ ! -d ".cache/$c" ] && tar -C .cache -xJf ".cache/$c.tar.xz"
done

# The pytest11 entry point and the console script need an install; without one, name the plugin.
if ! python3 -m pip install -q --no-deps --no-index --no-build-isolation -e . >"$R/install.log" 2>&1; then
  export PYTEST_ADDOPTS="-p tkverify.plugin"
fi
nvidia-smi --query-gpu=index,name,uuid,driver_version,memory.total --format=csv | tee "$R/gpu.txt"
python3 -c "import torch, tilelang; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'tilelang', tilelang.__version__)" | tee -a "$R/gpu.txt"

source scripts/steps.sh

run_group() {  # the steps of one group, in this order
  local STEPS=" $1 "
  local pin; pin=$(grep -o '@[0-9,]*' <<<"$1" | head -1)
  [ -n "$pin" ] && export CUDA_VISIBLE_DEVICES="${pin#@}"
  wants precompile && step precompile python3 -m kernels.precompile
  if wants pytest; then
    # GPU utilisation once a second while the suite runs, and each worker's own account of its GPU.
    watch_gpus "$R/gpu-util.csv" 1000; local util=$!
    step pytest timeout -k 10 "${PYTEST_SECONDS:-560}" python3 -m pytest -rfE -n "${WORKERS:-8}" --tk-impl "${TK_IMPL:-all}" --tk-profile ci \
      --tk-report="$R/pytest-report" -p no:cacheprovider ${SEED:+--hypothesis-seed="$SEED"} ${select:+-k "$select"} \
      ${PYTEST_EXTRA:-}
    kill "$util" 2>/dev/null
    step shards python3 -m tkverify.cli shards --merge "$R/pytest-report"
  fi
  wants report && step report python3 -m tkverify.cli report --impl tilelang --profile ci --out "$R/report-tilelang" \
    -n 8 ${select:+-k "$select"}
  # Every op's declared benchmark shapes (tkverify/specs), tile-kernels included where it is installed.
  wants bench && step bench python3 -m tkverify.cli bench --out "$R/bench"
  # What bounds each kernel (scripts/gpu-probe.sh: write rates, then Nsight Compute once a bench shape of
  # PROBE_OPS), then the bench again with those reasons in its notes: the table to commit.
  if wants probe; then
    step probe env OUT="$R" bash scripts/gpu-probe.sh "${PROBE_OPS:-}"
    step bench-ncu python3 -m tkverify.cli bench --ncu "$R/probe/ncu" --out "$R/bench-ncu"
  fi
  # Host time per call of the TileLang wrappers (what eager callers pay beyond the kernel).
  wants profile && step profile python3 scripts/profile_host.py -k per_token_cast,swiglu,expand_to_fused,transpose,engram,sinkhorn
  # Candidate static configurations, bitwise-checked against the shipped ones.
  wants tune && step tune python3 -m benchmarks.tune "$R/tune.json" ${TUNE_K:+-k "$TUNE_K"}
  if wants seeds; then  # the derandomised ci profile under other seeds: no false alarms
    for s in ${SEEDS:-1 2 3}; do
      suite_run "seed-$s" "${SEED_SECONDS:-600}" "${SEED_WORKERS:-4}" "${SEED_IMPL:-torch,tilelang}" ci --hypothesis-seed "$s"
    done
  fi
  # The fuzz profile (TKVERIFY_FUZZ_EXAMPLES a test): ours (the long no-false-alarm hunt), and
  # tile-kernels on its own (its JIT compiles per shape would slow ours). KILL at the cap (the whole
  # process group), then the report from the workers' shards, marked partial.
  wants fuzz && TKVERIFY_FUZZ_EXAMPLES="${FUZZ_EXAMPLES:-1000}" \
    suite_run fuzz "${FUZZ_SECONDS:-400}" "${FUZZ_WORKERS:-8}" "${FUZZ_IMPL:-torch,tilelang}" fuzz
  wants fuzz-tk && TKVERIFY_FUZZ_EXAMPLES="${FUZZ_TK_EXAMPLES:-200}" \
    suite_run fuzz-tk "${FUZZ_TK_SECONDS:-300}" "${FUZZ_TK_WORKERS:-8}" tile_kernels fuzz
  if wants suite; then  # the differential suite's wall time by worker count, over the GPUs this group sees
    local run
    for run in ${SUITE_WORKERS:-2}; do  # N, or N@GPUS: N workers over those GPUs only (e.g. 4@0), one after another
      local n=${run%@*} pin=""; [[ "$run" == *@* ]] && pin=${run#*@}
      local gpus; gpus=$(${pin:+env CUDA_VISIBLE_DEVICES=$pin} python3 -c "import torch; print(torch.cuda.device_count())")
      local tag="n$n-gpus$gpus"
      watch_gpus "$R/gpu-util-suite-$tag.csv" 500; local util=$!
      # Which process holds memory on which GPU: the workers' pids, to match against their shards.
      while sleep 2; do nvidia-smi --query-compute-apps=timestamp,pid,gpu_uuid,used_memory --format=csv,noheader; done \
        >"$R/gpu-apps-suite-$tag.csv" 2>/dev/null & local apps=$!
      ( [ -n "$pin" ] && export CUDA_VISIBLE_DEVICES=$pin
        TARGET="${SUITE_TARGET:-}" suite_run "suite-$tag" "${SUITE_SECONDS:-560}" "$n" "${SUITE_IMPL:-torch,tilelang}" ci )
      kill "$util" "$apps" 2>/dev/null
    done
  fi
  if wants mutants; then
    step mutants-tilelang python3 -m tkverify.cli mutants --impl tilelang --profile ci --out "$R/mutants-tilelang"
    [[ "${MUTANT_IMPLS:-tilelang torch}" == *torch* ]] && \
      step mutants-torch-cuda python3 -m tkverify.cli mutants --impl torch --profile ci --out "$R/mutants-torch-cuda"
  fi
  # Memory safety of the TileLang kernels on their GPU tests (bounded: the sanitizer is slow).
  # -v: a test's line shows it finished, so a run cut by its cap still says what ran clean.
  wants memcheck && step memcheck timeout "${MEMCHECK_SECONDS:-200}" compute-sanitizer --tool memcheck \
    --error-exitcode 99 python3 -m pytest -p no:cacheprovider -v -x ${MEMCHECK_TESTS:-tests/test_moe_kernels_gpu.py \
    tests/test_engram_kernels_gpu.py tests/test_mhc_kernels_gpu.py tests/test_regressions.py} \
    ${MEMCHECK_K:+-k "$MEMCHECK_K"}
  # Shared-memory races in the kernels that stage through shared memory.
  wants racecheck && step racecheck timeout "${RACECHECK_SECONDS:-90}" compute-sanitizer --tool racecheck \
    --error-exitcode 99 python3 -m pytest -p no:cacheprovider -v -x ${RACECHECK_TESTS:-tests/test_mhc_kernels_gpu.py \
    tests/test_engram_kernels_gpu.py} -k "${RACECHECK_K:-sinkhorn_within_bounds or autograd or reproducible}"
  if wants replay; then  # committed tile-kernels findings, in one process each (JIT compiles shared)
    [ -n "${REPLAY:-}" ] && step replay timeout -k 10 "${REPLAY_SECONDS:-240}" python3 -m tkverify.cli replay \
      $REPLAY --impl tile_kernels
    for f in ${REPLAY_EACH:-}; do  # one process a case: nothing earlier in the process can cause its verdict
      step "replay-$(basename "$f" .json)" timeout -k 10 "${REPLAY_SECONDS:-240}" python3 -m tkverify.cli replay \
        "$f" --impl tile_kernels
    done
    [ -n "${REPLAY_RAW:-}" ] && step replay-raw env TKVERIFY_TK_RAW=1 timeout -k 10 "${REPLAY_SECONDS:-240}" \
      python3 -m tkverify.cli replay $REPLAY_RAW --impl tile_kernels
  fi
  return 0
}

IFS='|' read -ra groups <<<"$STEPS"
pids=()
for g in "${groups[@]}"; do run_group "$g" & pids+=($!); done
wait "${pids[@]}"
cp -r .tkverify/cases "$R/cases" 2>/dev/null
for c in tilelang tilelang-main; do [ -d ".cache/$c" ] && tar -C .cache -cJf "$R/$c-cache.tar.xz" "$c"; done
tar -C "$(dirname "$R")" -czf "${OUT:-/tmp/out}/results.tar.gz" results && rm -rf "$R"
