#!/usr/bin/env bash
# Runs each libFuzzer target of a build for SECONDS seconds, JOBS at a time
# (default: the number of cores). Each starts by replaying
# fuzz/corpus/<target> (the seeds and every input that once found a bug),
# which stays untouched: new inputs go to BUILD/fuzz/<target>/corpus, and an
# input that fails is saved in BUILD/fuzz/<target>/ and fails the run.
# Usage: tools/run-fuzzers.sh BUILD SECONDS [SEED [JOBS]]
# SEED fixes libFuzzer's random choices (make test uses one, so that a run can
# be reproduced); 0 or none draws a new seed each run (make fuzz).
set -euo pipefail
build=$1 seconds=$2 seed=${3:-0} jobs=${4:-$(nproc)}
cd "$(dirname "$0")/.."

fuzz() {
  local target=$1 work=$build/fuzz/$1
  mkdir -p "$work/corpus"
  # -timeout: an input that takes 10 s is a hang; -malloc_limit_mb: one
  # allocation over 1 GiB is a size that should have been refused.
  if ! "$build/bin/fuzz_$target" -max_total_time="$seconds" -seed="$seed" -timeout=10 -rss_limit_mb=2048 \
      -malloc_limit_mb=1024 -max_len=8192 -print_final_stats=1 -artifact_prefix="$work/" \
      "$work/corpus" "fuzz/corpus/$target" >"$work/log" 2>&1; then
    tail -n 40 "$work/log"
    echo "fuzz_$target FAILED; the input is in $work/ (log: $work/log)"
    return 1
  fi
  echo "fuzz_$target: ${seconds} s, $(grep -oP 'stat::number_of_executed_units: \K[0-9]+' "$work/log") runs, clean"
}

failed=0
running=0
for target in npy safetensors attention rope capi pages; do
  if ((running == jobs)); then
    wait -n || failed=1
    running=$((running - 1))
  fi
  fuzz "$target" &
  running=$((running + 1))
done
while ((running > 0)); do
  wait -n || failed=1
  running=$((running - 1))
done
exit $failed
