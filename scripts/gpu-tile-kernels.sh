#!/usr/bin/env bash
# tkverify against DeepSeek's tile-kernels on the H200, for one bundle (through the device tool):
#   bash scripts/gpu-tile-kernels.sh main          # tilelang 0.1.15 + tile-kernels 2.1.0
#   bash scripts/gpu-tile-kernels.sh upstream-v1   # tilelang 0.1.11 + tile-kernels 1.0.0
# Env: TKVERIFY_FUZZ_EXAMPLES (default 60), FUZZ_SECONDS (default 300), STEPS (default "fuzz raw report replay").
# Only tkverify.suite is collected (never tests/), so our kernels package is not imported: under
# upstream-v1 its TileLang 0.1.15 code may not import.  Everything lands in $OUT/results.tar.gz.
set -uo pipefail
bundle="${1:-main}"
case "$bundle" in main | upstream-v1) ;; *) echo "usage: $0 main|upstream-v1" >&2; exit 2 ;; esac
source .gpu/setup.sh "$bundle" || exit 1  # (a bare source would pass this script's arguments on)
export PYTHONUNBUFFERED=1 TILELANG_CACHE_DIR="$PWD/.cache/tilelang-$bundle"
export TKVERIFY_FUZZ_EXAMPLES="${TKVERIFY_FUZZ_EXAMPLES:-60}"
R="${OUT:-/tmp/out}/results"; mkdir -p "$R"
STEPS="${STEPS:-fuzz raw report replay}"
FUZZ_SECONDS="${FUZZ_SECONDS:-300}"

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
SUITE=(python3 -m pytest --pyargs tkverify.suite -p no:cacheprovider -q -rs --tk-impl tile_kernels)
# A report from whatever shards the workers wrote, should the run have been cut short.
merge() { python3 - "$1" "$2" <<'EOF'
import sys
from pathlib import Path
from tkverify.report import merge_gradient_shards, merge_shards, merge_unsupported_shards, meta, write_report
out, profile = Path(sys.argv[1]), sys.argv[2]
if not (out / "report.md").is_file() and (out / "shards").is_dir():
    shards = list((out / "shards").glob("*.json"))
    write_report(out, merge_shards(shards), {**meta(profile, "tile_kernels"), "partial": True},
                 gradients=merge_gradient_shards(shards), unsupported=merge_unsupported_shards(shards))
    print(f"merged {len(shards)} shards of a run cut short into {out}/report.md")
EOF
}

# Hunt: every op and backward, the fuzz profile, failing cases saved per (op, impl).
if wants fuzz; then
  # SIGINT, so that pytest still merges the workers' shards into a report when time is up.
  step fuzz timeout -s INT -k 30 "$FUZZ_SECONDS" "${SUITE[@]}" -n 8 --tk-profile fuzz \
    --tk-report "$R/report-fuzz" --tk-cases "$R/cases"
  merge "$R/report-fuzz" fuzz
fi
# fused_mapping with the adapter's two conventions off, to record tile-kernels' raw layout (1.0 only).
wants raw && step raw env TKVERIFY_TK_RAW=1 timeout -k 10 120 "${SUITE[@]}" --tk-profile ci -k fused_mapping \
  --tk-cases "$R/cases-raw"
# The derandomised ci profile, through the CLI: the reproducible report to commit.
if wants report; then
  step report timeout -s INT -k 30 200 python3 -m tkverify.cli report --impl tile_kernels --profile ci -n 8 \
    --out "$R/report-ci" -- -rs "--tk-cases=$R/cases-ci"
  merge "$R/report-ci" ci
fi
# Every saved case replayed once more (the verdict, and what tile-kernels returned, for the findings).
if wants replay; then
  mkdir -p "$R/replays"
  for f in "$R"/cases*/*.json; do
    [ -e "$f" ] || continue
    n=$(basename "$(dirname "$f")")-$(basename "$f" .json)
    timeout 60 python3 -m tkverify.cli replay "$f" >"$R/replays/$n.txt" 2>&1
    echo "replay $n: rc=$?" | tee -a "$R/steps.txt"
  done
fi
tar -C "$(dirname "$R")" -czf "${OUT:-/tmp/out}/results.tar.gz" results && rm -rf "$R"
