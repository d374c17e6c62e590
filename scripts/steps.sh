# Sourced by the GPU scripts: `step NAME CMD...` runs CMD with its output in $R/NAME.log, appends
# its exit status and duration to $R/steps.txt and shows the log's tail; `wants NAME` tests $STEPS.
step() { local name=$1; shift; echo "=== $name: $*"; local t0=$(date +%s.%N)
  "$@" >"$R/$name.log" 2>&1; local rc=$?
  awk -v n="$name" -v rc="$rc" -v t0="$t0" -v t1="$(date +%s.%N)" \
    'BEGIN { printf "=== %s: rc=%s, %.1f s\n", n, rc, t1 - t0 }' | tee -a "$R/steps.txt"
  tail -n 25 "$R/$name.log"; }
# `watch_gpus FILE MS`: the GPUs' utilisation and memory in use every MS ms into FILE, in the background ($!).
watch_gpus() { nvidia-smi --query-gpu=timestamp,index,utilization.gpu,memory.used --format=csv,noheader \
  -lms "$2" >"$1" 2>/dev/null & }
wants() { [[ " $STEPS " == *" $1 "* ]]; }
# suite_run NAME SECONDS WORKERS IMPL PROFILE [pytest args]: tkverify.suite (TARGET: other tests) under
# pytest-xdist, KILLed at its cap (the whole process group), then its report from the workers' shards
# (marked partial if it was cut); its failing cases under $R/cases-NAME.
suite_run() {
  local name=$1 seconds=$2 workers=$3 impl=$4 profile=$5; shift 5
  step "$name" timeout -s KILL "$seconds" python3 -m pytest ${TARGET:---pyargs tkverify.suite} -p no:cacheprovider \
    -q -rfE -n "$workers" --tk-impl "$impl" --tk-profile "$profile" --tk-report "$R/$name" --tk-cases "$R/cases-$name" "$@"
  step "shards-$name" python3 -m tkverify.cli shards --merge "$R/$name"
}
