#!/usr/bin/env bash
# One GPU run of tkverify: the steps asked for, one after another, with their logs, reports and the kernel
# cache packed into OUT/results.tar.gz.  `scripts/gpu-run.sh --help` says how to call it.
set -uo pipefail

usage() {
  cat <<'EOF'
Usage: scripts/gpu-run.sh [--steps LIST] [--impl IMPLS] [--workers N] [--seed N] [--seeds LIST] [--seed-jobs K]
                          [--examples N] [--host-limit SECONDS]
                          [--tile-kernels 2.1.0|1.0.0] [-k EXPR] [--ops LIST] [--budget SECONDS]
                          [--commit HASH] [--out DIR]

Runs tkverify's checks on a CUDA machine, one step after another, and packs what
they write (logs, reports, saved cases, the kernel cache) into OUT/results.tar.gz.
On the H200 the device tool copies the working tree there, with .gpu/ (setup.sh
and the offline tilelang bundles) and, when carried, .cache/tilelang*.tar.xz (a
kernel cache, unpacked before the steps and packed again after them):

    source .gpu/setup.sh && bash scripts/gpu-run.sh --steps pytest,bench --commit abc1234
    bash scripts/gpu-run.sh --tile-kernels 1.0.0 --steps findings,report

(--tile-kernels 1.0.0 needs the upstream-v1 bundle, tile-kernels-1.0.0-py312-site.tar.xz,
beside .gpu/setup.sh.)

Steps (--steps, a comma list, run in the order given):
  precompile  compile every TileLang configuration into the kernel cache (python -m kernels.precompile,
              WORKERS configurations at a time)
  pytest      the project's tests: pytest -n WORKERS --tk-impl IMPLS --tk-profile ci --tk-report,
              the report merged from the workers' shards if the step is cut
  report      the differential suite's report: tkverify report --impl IMPLS --profile ci, then the
              cases it saved replayed
  seeds       the same report once per seed of --seeds (seed-N/, cases-seed-N/, seed-N.log), --seed-jobs
              of them at a time, until the budget runs out; the saved cases are not replayed
  fuzz        the differential suite under the fuzz profile, EXAMPLES a test, then the cases it saved
              replayed
  bench       tkverify bench over every op's benchmark shapes (OPS only, if given)
  production  every op's benchmark shapes judged against the float64 oracle (OPS only, if given):
              tkverify sweep --parts none --production --host-limit HOST_LIMIT --host-workers WORKERS (a
              shape whose host oracle would take longer is skipped and listed)
  ncu         Nsight Compute over each benchmark shape of the tilelang kernels, one process a shape,
              then the bench again with what bounds each tilelang row in its notes (tkverify bench --ncu)
  mutants     tkverify mutants --impl tilelang, then --impl torch (on the GPU)
  sanitize    compute-sanitizer: memcheck over the GPU kernel tests, racecheck over those of the
              kernels that stage through shared memory
  findings    every committed tile-kernels case (reports/tile-kernels/*/cases/) replayed against the
              installed tile-kernels, and those under cases/raw/ with TKVERIFY_TK_RAW=1
  Default: precompile,pytest,bench,mutants,sanitize; with --tile-kernels: findings,report,fuzz.

Options:
  --steps LIST        the steps above
  --impl IMPLS        what pytest, report, fuzz and bench judge: all, or a comma list of torch, tilelang,
                      tile_kernels (default all; with --tile-kernels, tile_kernels)
  --workers N         pytest-xdist workers of pytest, report and fuzz (default 8)
  --seed N            --hypothesis-seed of pytest, report and fuzz (under the ci profile it also draws
                      other examples than the derandomised default)
  --seeds LIST        the seeds of the seeds step, a comma list (e.g. 4,5,6)
  --host-limit S      the production step's limit on a shape's estimated host-oracle time (default 200 s);
                      its shapes are judged on WORKERS host threads
  --seed-jobs K       seeded reports run at a time (default 1).  A run of tile-kernels spends its end in a few
                      workers compiling one test's shapes one after another while the others idle, so two or
                      three seeds at a time (with --workers 8 or so) overlap those tails
  --examples N        examples a test in the fuzz step (default 1000; with --tile-kernels, 100)
  --tile-kernels REL  judge that tile-kernels release: 2.1.0 (bundle main: tilelang 0.1.15) or 1.0.0
                      (bundle upstream-v1: tilelang 0.1.11, under which our kernels do not import, so
                      precompile, ncu, mutants and sanitize are refused); pytest then collects the
                      differential suite (tkverify.suite) alone, and the kernel cache is
                      .cache/tilelang-<bundle>
  -k EXPR             pytest -k expression for pytest, report, fuzz and sanitize
  --ops LIST          comma list of op-name substrings for bench and ncu (tkverify bench -k)
  --budget SECONDS    the whole run's time (default 540): a step is killed when it would leave less than
                      30 s to pack the results, and one that would start with less than 15 s is skipped
  --commit HASH       the commit the reports' meta names (TKVERIFY_COMMIT): give it, because the
                      machine's copy of .git can be older than the tree it runs
  --out DIR           where results.tar.gz goes (default $OUT, else /tmp/out)
  -h, --help          this text

In OUT/results.tar.gz: results/env.txt (GPU, driver, versions, commit, what is available),
steps.txt (each step's exit status and seconds), <step>.log, and the folders the steps
write: pytest/, report/, seed-N/, fuzz/ (report.md/.json/.html; the shards are dropped once merged),
cases-*/ (failing cases), production/, bench/, bench-ncu/, ncu/, mutants-tilelang/, mutants-torch/.  The
kernel cache comes back beside it as OUT/<cache>-cache.tar.xz.00, .01, ... (parts of 15 MiB, under the device's
16 MiB a file; `cat` them together to unpack).
EOF
}

STEPS="" IMPL="" WORKERS=8 SEED="" SEEDS="" SEED_JOBS=1 HOST_LIMIT=200 EXAMPLES="" RELEASE="" SELECT="" OPS="" BUDGET=540
OUT_DIR="${OUT:-/tmp/out}"
RESERVE=30  # seconds kept for packing the results
T0=$SECONDS

die() { echo "gpu-run.sh: $*" >&2; exit 2; }

parse_args() {
  while [ $# -gt 0 ]; do
    case "$1" in
      -h | --help) usage; exit 0 ;;
      --steps) STEPS="${2:?}"; shift ;;
      --impl) IMPL="${2:?}"; shift ;;
      --workers) WORKERS="${2:?}"; shift ;;
      --seed) SEED="${2:?}"; shift ;;
      --seeds) SEEDS="${2:?}"; shift ;;
      --seed-jobs) SEED_JOBS="${2:?}"; shift ;;
      --host-limit) HOST_LIMIT="${2:?}"; shift ;;
      --examples) EXAMPLES="${2:?}"; shift ;;
      --tile-kernels) RELEASE="${2:?}"; shift ;;
      -k) SELECT="${2:?}"; shift ;;
      --ops) OPS="${2:?}"; shift ;;
      --budget) BUDGET="${2:?}"; shift ;;
      --commit) export TKVERIFY_COMMIT="${2:?}"; shift ;;
      --out) OUT_DIR="${2:?}"; shift ;;
      *) die "unknown argument '$1' (see --help)" ;;
    esac
    shift
  done
  case "$RELEASE" in
    "") BUNDLE=main; CACHE=tilelang ;;
    2.1.0) BUNDLE=main; CACHE=tilelang-main ;;
    1.0.0) BUNDLE=upstream-v1; CACHE=tilelang-upstream-v1 ;;
    *) die "--tile-kernels takes 2.1.0 or 1.0.0, not '$RELEASE'" ;;
  esac
  if [ -n "$RELEASE" ]; then
    STEPS="${STEPS:-findings,report,fuzz}" IMPL="${IMPL:-tile_kernels}" EXAMPLES="${EXAMPLES:-100}"
  else
    STEPS="${STEPS:-precompile,pytest,bench,mutants,sanitize}" IMPL="${IMPL:-all}" EXAMPLES="${EXAMPLES:-1000}"
  fi
  local s
  for s in ${STEPS//,/ }; do
    case "$s" in
      pytest | report | seeds | fuzz | bench | findings | production) ;;
      precompile | ncu | mutants | sanitize)
        [ "$RELEASE" = 1.0.0 ] && die "step $s needs our kernels, which do not import under tile-kernels 1.0.0's tilelang" ;;
      *) die "unknown step '$s' (see --help)" ;;
    esac
  done
}

# The environment: the bundle's tilelang (and tile-kernels) on PYTHONPATH, this checkout installed so that
# pytest finds the plugin (without the install, the plugin is named on every pytest command line), the
# carried kernel cache unpacked, and what the reports' meta will not say written to env.txt.
setup() {
  if [ -f .gpu/setup.sh ]; then
    # shellcheck disable=SC1091  # the bundle's setup.sh lives on the GPU machine only
    source .gpu/setup.sh "$BUNDLE" || exit 1
  fi
  export PYTHONUNBUFFERED=1 TILELANG_CACHE_DIR="$PWD/.cache/$CACHE"
  R="$OUT_DIR/results"
  rm -rf "$R" && mkdir -p "$R"  # a results folder left by an earlier call is not this run's
  if [ -f ".cache/$CACHE.tar.xz" ] && [ ! -d ".cache/$CACHE" ]; then
    tar -C .cache -xJf ".cache/$CACHE.tar.xz"
  fi
  python3 -m pip install -q --no-deps --no-index --no-build-isolation -e . >"$R/install.log" 2>&1
  if ! python3 -c "import importlib.metadata as m, sys
sys.exit(not any(e.name == 'tkverify' for e in m.entry_points(group='pytest11')))"; then
    export PYTEST_ADDOPTS="-p tkverify.plugin"
  fi
  {
    echo "tile-kernels release: ${RELEASE:-as installed}, bundle $BUNDLE, commit ${TKVERIFY_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null)}"
    nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv
    python3 -c "import importlib.metadata as m, torch, tilelang
try:
    tk = m.version('tile-kernels')
except m.PackageNotFoundError:
    tk = 'not installed'
print('torch', torch.__version__, 'cuda', torch.version.cuda, '| tilelang', tilelang.__version__, '| tile-kernels', tk)"
    python3 -m tkverify.cli list
  } >"$R/env.txt" 2>&1
  head -n 4 "$R/env.txt"
}

# step NAME CAP CMD...: CMD killed (its whole process group) after CAP seconds or when the budget would
# leave less than RESERVE (CAP 0: the budget alone), its output in NAME.log; its exit status and
# duration appended to steps.txt; the log's tail shown.  SIGKILL, not SIGINT: an interrupted pytest writes
# a report that does not say it was cut, and an interrupt inside a call can save a case that replays PASS
# (reports/evidence/framework.md#capped-runs); after a KILL the report comes from the shards, marked partial.
step() {
  local name=$1 cap=$2; shift 2
  local left=$((BUDGET - (SECONDS - T0) - RESERVE))
  if ((cap > 0 && cap < left)); then left=$cap; fi
  if ((left < 15)); then
    echo "=== $name: skipped, out of time" | tee -a "$R/steps.txt"
    return 0
  fi
  echo "=== $name (at most $left s): $*"
  local t0=$SECONDS
  timeout -s KILL "$left" "$@" >"$R/$name.log" 2>&1
  local rc=$?
  echo "=== $name: rc=$rc, $((SECONDS - t0)) s" | tee -a "$R/steps.txt"
  tail -n 25 "$R/$name.log"
}

# The report of a pytest run from its workers' shards when the run was cut (marked partial), and a check
# that report.json holds every shard's rows.
merge_shards() { step "$1-shards" 60 python3 -m tkverify.cli shards --merge "$R/$1"; }

# The cases a step saved, replayed once more in one process: verdict and worst element of each.
replay_saved() {
  local saved=("$R/cases-$1"/*.json)
  [ -e "${saved[0]}" ] && step "$1-replay" 120 python3 -m tkverify.cli replay "${saved[@]}"
  return 0
}

# The pytest options every step that runs pytest shares.
pytest_options() {
  local name=$1 profile=$2
  echo "-p no:cacheprovider -rfE -rs -n $WORKERS --tk-impl $IMPL --tk-profile $profile --tk-report $R/$name" \
    "--tk-cases $R/cases-$name${SEED:+ --hypothesis-seed $SEED}"
}

run_precompile() { step precompile 0 python3 -m kernels.precompile --jobs "$WORKERS"; }

run_pytest() {
  local target=()
  [ -n "$RELEASE" ] && target=(--pyargs tkverify.suite)
  # shellcheck disable=SC2046  # the shared options split into words on purpose
  step pytest 0 python3 -m pytest "${target[@]}" $(pytest_options pytest ci) ${SELECT:+-k "$SELECT"}
  merge_shards pytest
}

run_report() {
  step report 0 python3 -m tkverify.cli report --impl "$IMPL" --profile ci -n "$WORKERS" --out "$R/report" \
    ${SELECT:+-k "$SELECT"} -- -rs "--tk-cases=$R/cases-report" ${SEED:+--hypothesis-seed="$SEED"}
  merge_shards report
  replay_saved report
}

# One ci report per seed of --seeds, SEED_JOBS at a time: seeds it has no time left for are listed as skipped.
run_seeds() {
  local seed
  [ -n "$SEEDS" ] || die "the seeds step needs --seeds LIST"
  for seed in ${SEEDS//,/ }; do
    while (($(jobs -rp | wc -l) >= SEED_JOBS)); do wait -n; done
    step "seed-$seed" 0 python3 -m tkverify.cli report --impl "$IMPL" --profile ci -n "$WORKERS" \
      --out "$R/seed-$seed" ${SELECT:+-k "$SELECT"} -- -rs "--tk-cases=$R/cases-seed-$seed" --hypothesis-seed="$seed" &
  done
  wait
  for seed in ${SEEDS//,/ }; do
    [ -d "$R/seed-$seed" ] && merge_shards "seed-$seed"
  done
  return 0
}

run_fuzz() {
  # shellcheck disable=SC2046
  step fuzz 0 env TKVERIFY_FUZZ_EXAMPLES="$EXAMPLES" python3 -m pytest --pyargs tkverify.suite -q \
    $(pytest_options fuzz fuzz) ${SELECT:+-k "$SELECT"}
  merge_shards fuzz
  replay_saved fuzz
}

# --impl for bench: every implementation unless a list is given.
bench_impl() { [ "$IMPL" != all ] && echo "--impl $IMPL"; }

run_bench() {
  # shellcheck disable=SC2046
  step bench 0 python3 -m tkverify.cli bench --out "$R/bench" $(bench_impl) ${OPS:+-k "$OPS"}
}

run_production() {
  step production 0 python3 -m tkverify.cli sweep --parts none --production ${OPS:+-k "$OPS"} \
    --host-limit "$HOST_LIMIT" --host-workers "$WORKERS" --budget $((BUDGET - (SECONDS - T0) - RESERVE - 20)) \
    --out "$R/production"
}

# Nsight Compute at the clocks the bench runs at (--clock-control none: ncu's default base clocks make
# compute-bound kernels about 1.2x slower than in the bench, reports/evidence/framework.md#ncu-verdict),
# one process a shape, each CSV under the name tkverify.ncu gives it.
# Shapes are profiled in bench order until 120 s of the budget are left for the bench that reads them.
run_ncu() {
  local ncu candidate
  ncu=$(command -v ncu)
  for candidate in /usr/local/cuda*/bin/ncu /opt/nvidia/nsight-compute/*/ncu; do
    [ -z "$ncu" ] && [ -x "$candidate" ] && ncu=$candidate
  done
  if [ -z "$ncu" ]; then
    echo "=== ncu: skipped, no ncu on this machine" | tee -a "$R/steps.txt"
    return 0
  fi
  mkdir -p "$R/ncu"
  local t0=$SECONDS i name
  while read -r i name; do
    if ((BUDGET - (SECONDS - T0) - RESERVE < 120 + 90)); then
      echo "ncu: out of time before $name" >>"$R/ncu.log"
      break
    fi
    timeout -s KILL 90 "$ncu" --clock-control none --csv --page raw \
      --section SpeedOfLight --section WarpStateStats --section Occupancy --section LaunchStats \
      --section MemoryWorkloadAnalysis --metrics dram__bytes_read.sum,dram__bytes_write.sum \
      python3 scripts/dram_counters.py -k "$OPS" --entry "$i" 2>>"$R/ncu.log" | gzip >"$R/ncu/$name"
  done < <(python3 scripts/dram_counters.py -k "$OPS" --list)
  echo "=== ncu: $(find "$R/ncu" -type f | wc -l) shapes, $((SECONDS - t0)) s" | tee -a "$R/steps.txt"
  # shellcheck disable=SC2046
  step bench-ncu 0 python3 -m tkverify.cli bench --ncu "$R/ncu" --out "$R/bench-ncu" $(bench_impl) ${OPS:+-k "$OPS"}
}

run_mutants() {
  step mutants-tilelang 0 python3 -m tkverify.cli mutants --impl tilelang --profile ci --out "$R/mutants-tilelang"
  step mutants-torch 0 python3 -m tkverify.cli mutants --impl torch --profile ci --out "$R/mutants-torch"
}

# The sanitizer is slow: each tool has a cap of its own, and -v prints a line a test, so a run cut by its
# cap still says which tests ran clean.
run_sanitize() {
  step memcheck 200 compute-sanitizer --tool memcheck --error-exitcode 99 python3 -m pytest -p no:cacheprovider -v -x \
    tests/test_moe_kernels_gpu.py tests/test_engram_kernels_gpu.py tests/test_mhc_kernels_gpu.py tests/test_regressions.py \
    ${SELECT:+-k "$SELECT"}
  step racecheck 90 compute-sanitizer --tool racecheck --error-exitcode 99 python3 -m pytest -p no:cacheprovider -v -x \
    tests/test_mhc_kernels_gpu.py tests/test_engram_kernels_gpu.py \
    -k "${SELECT:-sinkhorn_within_bounds or autograd or reproducible}"
}

# Every committed case, in one process (tile-kernels' JIT compiles shared between cases); exit status 1
# when any case fails, which the findings expect.
run_findings() {
  local cases=(reports/tile-kernels/*/cases/*.json) raw=(reports/tile-kernels/*/cases/raw/*.json)
  step findings 0 python3 -m tkverify.cli replay "${cases[@]}" --impl tile_kernels
  [ -e "${raw[0]}" ] && step findings-raw 120 env TKVERIFY_TK_RAW=1 python3 -m tkverify.cli replay "${raw[@]}" \
    --impl tile_kernels
  return 0
}

# What comes back from the device must stay under 16 MiB a file: the merged reports' shards stay behind, and the
# kernel cache travels in parts of its own.
pack_results() {
  [ -d .tkverify/cases ] && cp -r .tkverify/cases "$R/cases-other"
  find "$R" -mindepth 2 -maxdepth 2 -type d -name shards -exec rm -rf {} +
  [ -d ".cache/$CACHE" ] && tar -C .cache -cf - "$CACHE" | xz -T0 -1 | split -b 15M -d - "$OUT_DIR/$CACHE-cache.tar.xz."
  echo "=== total: $((SECONDS - T0)) s of a $BUDGET s budget" | tee -a "$R/steps.txt"
  tar -C "$OUT_DIR" -czf "$OUT_DIR/results.tar.gz" results && rm -rf "$R"
  find "$OUT_DIR" -maxdepth 1 -type f -size +16M -printf "=== %f is over the 16 MiB a returned file may have\n"
}

main() {
  parse_args "$@"
  setup
  local s
  for s in ${STEPS//,/ }; do
    "run_$s"
  done
  pack_results
}

main "$@"
