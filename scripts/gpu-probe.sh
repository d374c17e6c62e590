#!/usr/bin/env bash
# What bounds the kernels that miss their bandwidth targets (issue 8's "measured reason"), on the H200:
#   source .gpu/setup.sh && bash scripts/gpu-probe.sh [ops for dram_counters -k]
#   (then, in the same call: python3 -m tkverify.cli bench -k OPS --ncu "$OUT/probe/ncu" --out "$OUT/bench")
# 1. scripts/write_rate.cu: DRAM write-only rate by the way the writes are issued (is fill_ the ceiling?)
# 2. Nsight Compute over scripts/dram_counters.py, one process a benchmark shape: per launch, DRAM bytes
#    and throughput, SM throughput, warp stall reasons, occupancy, registers (sections SpeedOfLight,
#    WarpStateStats, Occupancy, LaunchStats, MemoryWorkloadAnalysis; the raw page, every metric a column).
# Output under $OUT/probe (ncu/<shape>.csv.gz: `tkverify bench --ncu` and scripts/ncu_table.py read them).
set -uo pipefail
P="${OUT:-/tmp/out}/probe"; mkdir -p "$P"
export PYTHONUNBUFFERED=1 TILELANG_CACHE_DIR="$PWD/.cache/tilelang"
[ -f .cache/tilelang.tar.xz ] && [ ! -d .cache/tilelang ] && tar -C .cache -xJf .cache/tilelang.tar.xz
python3 -m pip install -q --no-deps --no-index --no-build-isolation -e . >/dev/null 2>&1 || export PYTEST_ADDOPTS="-p tkverify.plugin"
start=$SECONDS
nvcc -O3 -arch=sm_90 -o /tmp/write_rate scripts/write_rate.cu >"$P/write_rate.log" 2>&1 \
  && timeout 120 /tmp/write_rate 2048 >>"$P/write_rate.log" 2>&1
echo "=== write_rate: rc=$?, $((SECONDS - start)) s" | tee -a "$P/steps.txt"
NCU=$(command -v ncu || ls /usr/local/cuda*/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
echo "ncu: ${NCU:-none}; $($NCU --version 2>&1 | tail -1)" | tee -a "$P/steps.txt"
# One ncu process a benchmark shape, its CSV under the name tkverify.ncu.counters_file gives it:
# `tkverify bench --ncu $OUT/probe/ncu` adds what bounds each row to the bench's notes.
if [ -n "$NCU" ]; then
  start=$SECONDS; ops="${1:-engram,expand,cast,swiglu,transpose}"; mkdir -p "$P/ncu"
  python3 scripts/dram_counters.py -k "$ops" --list | while read -r i name; do
    (( SECONDS - start > ${PROBE_SECONDS:-300} )) && { echo "ncu: out of time before $name" >>"$P/steps.txt"; break; }
    # --clock-control none: the clocks the bench runs at (ncu's default locks them to base: run 17's
    # compute-bound kernels took 1.2x their bench time under it)
    # PROBE_NVTX=1: only the op's launches (dram_counters.py's NVTX range), not the inputs' making, which
    # made run 23's ncu take about 15 s a shape (not yet tried on the device: off by default)
    timeout 90 "$NCU" ${PROBE_NVTX:+--nvtx --nvtx-include "tkverify-op/"} --clock-control none --csv --page raw \
      --section SpeedOfLight --section WarpStateStats \
      --section Occupancy --section LaunchStats --section MemoryWorkloadAnalysis \
      --metrics dram__bytes_read.sum,dram__bytes_write.sum \
      python3 scripts/dram_counters.py -k "$ops" --entry "$i" 2>>"$P/ncu.err" | gzip >"$P/ncu/$name"
  done
  echo "=== ncu: $(ls "$P/ncu" | wc -l) shapes, $((SECONDS - start)) s" | tee -a "$P/steps.txt"
fi
