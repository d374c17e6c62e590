#!/usr/bin/env bash
# tkverify against DeepSeek's tile-kernels on the H200, for one bundle (through the device tool):
#   bash scripts/gpu-tile-kernels.sh main          # tilelang 0.1.15 + tile-kernels 2.1.0
#   bash scripts/gpu-tile-kernels.sh upstream-v1   # tilelang 0.1.11 + tile-kernels 1.0.0
# Give the commit literally (TKVERIFY_COMMIT=<hash>): the device's copy of .git may be older than the tree
# it runs (session 5's runs 11-13 reported c123282-dirty).
# Env: BUDGET (default 285: seconds for the whole script, setup and tile-kernels' JIT compiles
# included), TKVERIFY_FUZZ_EXAMPLES (default 60), FINDINGS_SECONDS, REPORT_SECONDS, FUZZ_SECONDS (the
# steps' caps, default 120, 160, 170), STEPS (default "findings report fuzz found",
# plus "raw" for upstream-v1; "bench" is extra), FINDINGS (the case files to replay, default
# every committed one), FINDINGS_PROCS (the processes they are dealt over, default 1), FUZZ_K (a pytest
# -k expression for the fuzz steps: e.g. the one test whose per-shape JIT compiles kept an earlier run
# from finishing), FUZZ_SEEDS (fuzz-seeds: one process a seed), SEEDS_K and SEEDS_EXAMPLES (fuzz-seeds'
# -k and examples a seed, default FUZZ_K's and TKVERIFY_FUZZ_EXAMPLES; with both fuzz and fuzz-seeds,
# FUZZ_K="not X" and SEEDS_K="X" split the hunt, and fuzz-all merges it back), FUZZ_WORKERS and
# REPORT_WORKERS (pytest -n of fuzz and report, default 7).  The first steps run side by side, found
# after them; each is capped so that the whole stays within BUDGET:
#   findings  every committed case, reports/tile-kernels-*/cases/*.json, replayed (FINDINGS_PROCS processes)
#             (cases/raw/*.json with TKVERIFY_TK_RAW=1: the adapter's size refusals off)
#   raw       fused_mapping with the adapter's conventions off (1.0 only)
#   report    the derandomised ci profile: the report to commit
#   fuzz      the fuzz profile, failing cases saved per (op, impl)
#   fuzz-seeds  the same, one process per seed in FUZZ_SEEDS side by side, merged into one report
#   found     the cases this run saved, replayed in one process
#   bench     `tkverify bench --impl tile_kernels`, one family at a time once everything else is done
#             (its JIT compiles are made first, side by side with the other steps, at one repetition)
# Only tkverify.suite is collected (never tests/), so our kernels package is not imported: under
# upstream-v1 its TileLang 0.1.15 code may not import.  Everything lands in $OUT/results.tar.gz.
set -uo pipefail
T0=$(date +%s)  # the budget counts from here: setup, installs and JIT compiles included
bundle="${1:-main}"
case "$bundle" in main | upstream-v1) ;; *) echo "usage: $0 main|upstream-v1" >&2; exit 2 ;; esac
source .gpu/setup.sh "$bundle" || exit 1  # (a bare source would pass this script's arguments on)
export PYTHONUNBUFFERED=1 TILELANG_CACHE_DIR="$PWD/.cache/tilelang-$bundle"
# tile-kernels' JIT kernels of an earlier call, when carried (.cache/tilelang-$bundle.tar.xz); they go back too.
[ -f ".cache/tilelang-$bundle.tar.xz" ] && [ ! -d "$TILELANG_CACHE_DIR" ] && tar -C .cache -xJf ".cache/tilelang-$bundle.tar.xz"
export TKVERIFY_FUZZ_EXAMPLES="${TKVERIFY_FUZZ_EXAMPLES:-60}"
R="${OUT:-/tmp/out}/results"; mkdir -p "$R"
BUDGET="${BUDGET:-285}"
default_steps="findings report fuzz found"; [ "$bundle" = upstream-v1 ] && default_steps="findings raw report fuzz found"
STEPS="${STEPS:-$default_steps}"
# cap N [RESERVE]: N seconds, or what the budget has left after RESERVE seconds for later steps (>= 15).
cap() { local left=$(( BUDGET - ($(date +%s) - T0) - ${2:-0} )); (( left < $1 )) && echo $(( left > 15 ? left : 15 )) || echo "$1"; }

# The pytest11 entry point and the console script need an install; without one, name the plugin.
python3 -m pip install -q --no-deps --no-index --no-build-isolation -e . >"$R/install.log" 2>&1
if ! python3 -c "import importlib.metadata as m, sys
sys.exit(not any(e.name == 'tkverify' for e in m.entry_points(group='pytest11')))"; then
  export PYTEST_ADDOPTS="-p tkverify.plugin"
fi
{ echo "bundle $bundle"; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
  python3 -c "import importlib.metadata as m, torch, tilelang; print('torch', torch.__version__, 'tilelang', tilelang.__version__, 'tile-kernels', m.version('tile-kernels'))"
  python3 -c "import tile_kernels; print('tile_kernels imports:', tile_kernels.__file__)"
  python3 -m tkverify.cli list | grep -A1 '^[a-z]' | grep -v '^--'; } >"$R/env.txt" 2>&1
cat "$R/env.txt"

source scripts/steps.sh

# findings, raw, report and fuzz run side by side (one GPU, 16 cores: 1 + 1 + 7 + 7 processes), each
# under its own cap, so that one ~300 s call holds all of them; then the cases this run saved.
if wants findings; then  # the committed findings, confirmed or refuted: FINDINGS_PROCS processes (default 1),
  # the cases dealt out in name order, each process compiling tile-kernels' JIT kernels its cases need once
  read -ra cases <<<"$(echo ${FINDINGS:-reports/tile-kernels-*/cases/*.json})"
  procs=${FINDINGS_PROCS:-1}
  for ((p = 1; p <= procs; p++)); do
    share=(); for ((i = p - 1; i < ${#cases[@]}; i += procs)); do share+=("${cases[i]}"); done
    [ ${#share[@]} -gt 0 ] && step "findings-$p" timeout -k 10 "$(cap "${FINDINGS_SECONDS:-120}" 60)" \
      python3 -m tkverify.cli replay "${share[@]}" --impl tile_kernels &
  done
  step findings-raw env TKVERIFY_TK_RAW=1 timeout -k 5 "$(cap 30 50)" python3 -m tkverify.cli replay \
    reports/tile-kernels-*/cases/raw/*.json --impl tile_kernels &
fi
# fused_mapping with the adapter's two conventions off, to record tile-kernels' raw layout (1.0 only).
wants raw && TKVERIFY_TK_RAW=1 suite_run raw "$(cap 60 60)" 1 tile_kernels ci -rs -k fused_mapping &
# The derandomised ci profile, through the CLI: the reproducible report to commit.  KILL at the cap
# (timeout signals the whole process group), then the report from the shards, marked partial: on an
# interrupt pytest wrote a report of its own that did not say the run was cut (session 3's fuzz run).
wants report && step report timeout -s KILL "$(cap "${REPORT_SECONDS:-160}" 60)" python3 -m tkverify.cli report \
  --impl tile_kernels --profile ci -n "${REPORT_WORKERS:-7}" --out "$R/report-ci" -- -rs "--tk-cases=$R/cases-ci" &
# The hunt: every op and backward, the fuzz profile, failing cases saved per (op, impl), report in $R/fuzz.
wants fuzz && suite_run fuzz "$(cap "${FUZZ_SECONDS:-170}" 60)" "${FUZZ_WORKERS:-7}" tile_kernels fuzz -rs ${FUZZ_K:+-k "$FUZZ_K"} &
# The same hunt split over seeds, one process each, side by side (FUZZ_SEEDS, default 1..8): a test whose
# per-shape JIT compiles make one process too slow for the examples asked (1.0.0's Sinkhorn forward, about
# 17 s a new shape in run 15) gets them from several processes at once, each drawing its own examples
# (TKVERIFY_FUZZ_EXAMPLES a seed); the seeds' shards are merged into one report, fuzz-seeds.
if wants fuzz-seeds; then
  SEEDS_K="${SEEDS_K-${FUZZ_K:-}}"
  for s in ${FUZZ_SEEDS:-1 2 3 4 5 6 7 8}; do
    ( export TKVERIFY_FUZZ_EXAMPLES="${SEEDS_EXAMPLES:-$TKVERIFY_FUZZ_EXAMPLES}"
      suite_run "fuzz-seed-$s" "$(cap "${FUZZ_SECONDS:-170}" 60)" 1 tile_kernels fuzz -rs ${SEEDS_K:+-k "$SEEDS_K"} \
        --hypothesis-seed "$s" ) &
  done
fi
FAMILIES="moe quant mhc engram transpose"
if wants bench; then  # compile what the bench will time (one repetition, no graph), families side by side
  for f in $FAMILIES; do
    timeout -k 5 "$(cap 150 90)" python3 -m tkverify.cli bench --impl tile_kernels -k "$f." --reps 1 --no-graph \
      --out "$R/bench-warm-$f" >"$R/bench-warm-$f.log" 2>&1 &
  done
fi
wait
# A report run cut by its cap: its report from the shards its workers wrote (every <= 15 s), marked partial.
[ -d "$R/report-ci/shards" ] && [ ! -f "$R/report-ci/report.json" ] && python3 -m tkverify.cli shards --merge "$R/report-ci"
# merge_runs NAME RUN...: one report, $R/NAME, from the shards of several runs under $R (each shard named
# after its run, so that the workers' names do not collide).
merge_runs() {
  local name=$1 run f; shift; mkdir -p "$R/$name/shards"
  for run; do
    for f in "$R/$run"/shards/*.json; do [ -e "$f" ] && cp "$f" "$R/$name/shards/$run-$(basename "$f")"; done
  done
  step "shards-$name" python3 -m tkverify.cli shards --merge "$R/$name"
}
if wants fuzz-seeds; then
  seed_runs=(); for s in ${FUZZ_SEEDS:-1 2 3 4 5 6 7 8}; do seed_runs+=("fuzz-seed-$s"); done
  merge_runs fuzz-seeds "${seed_runs[@]}"
  # the fuzz run and its seeds together: the one report of the whole hunt
  wants fuzz && merge_runs fuzz-all fuzz "${seed_runs[@]}"
fi
# Every case this run saved, replayed once more in one process (verdict and worst element, for the findings).
if wants found; then
  found=("$R"/cases*/*.json)
  [ -e "${found[0]}" ] && step found timeout -k 5 "$(cap 45 5)" python3 -m tkverify.cli replay "${found[@]}"
fi
if wants bench; then  # timed alone on the GPU, on a warm cache; `tkverify bench --merge` joins the families
  for f in $FAMILIES; do
    step "bench-$f" timeout -k 5 "$(cap 60 5)" python3 -m tkverify.cli bench --impl tile_kernels -k "$f." \
      --out "$R/bench-$f"
  done
fi
echo "=== total: $(( $(date +%s) - T0 )) s of a $BUDGET s budget" | tee -a "$R/steps.txt"
[ -d "$TILELANG_CACHE_DIR" ] && tar -C .cache -cJf "$R/tilelang-$bundle-cache.tar.xz" "tilelang-$bundle"
tar -C "$(dirname "$R")" -czf "${OUT:-/tmp/out}/results.tar.gz" results && rm -rf "$R"
