#!/usr/bin/env bash
# Runs the aarch64 C++ test binary under qemu-aarch64 on emulated Arm CPUs.
#   tools/test-arm.sh [--best-only] [--shards N] BINARY GTEST_FILTER CPU/TARGET[/UNIT[/INT8_UNIT]]...
#                     [-- GTEST_FILTER CPU/TARGET[/UNIT[/INT8_UNIT]]...]...
# (each group of CPUs after -- runs the tests of its own filter; each CPU once).
# CPU is qemu's -cpu value, TARGET the best Highway target it must dispatch to
# (the test Kernels.SimdTargetsOfThisCpu checks it), UNIT and INT8_UNIT the
# bf16 and int8 units it must use (default highway; Precision.UnitIsTheCPUs
# checks them). On each CPU the kernel
# tests force every target it can run, one at a time, as on x86; with
# --best-only, TARGET alone (ATTN_TEST_TARGETS). ATTN_TEST_EMULATED makes the
# few tests that are impractical under emulation run smaller. With --shards
# N, each CPU's tests are split into N processes (GoogleTest's sharding), so
# that one CPU's run keeps every core busy. The processes of all the CPUs run
# ARM_JOBS at a time (default: the number of cores), from one queue. Prints,
# per CPU, the targets that ran, the test counts and the time (of its slowest
# shard); fails on any failure.
set -uo pipefail
best_only=0 shards=1
while [ $# -gt 0 ]; do
  case $1 in
    --best-only) best_only=1 && shift ;;
    --shards) shards=$2 && shift 2 ;;
    *) break ;;
  esac
done
bin=$1
shift
specs=() filters=()  # each CPU and its filter
while [ $# -gt 0 ]; do
  filter=$1
  shift
  while [ $# -gt 0 ] && [ "$1" != -- ]; do
    specs+=("$1") filters+=("$filter")
    shift
  done
  [ $# -gt 0 ] && shift
done
logs=$(dirname "$bin")/../test-arm-logs
mkdir -p "$logs"
jobs=${ARM_JOBS:-$(nproc)}

field_of() {  # CPU_SPEC N: its Nth /-separated field, or highway where it has none (the units)
  local fields
  IFS=/ read -ra fields <<<"$1"
  echo "${fields[$2]:-highway}"
}
cpu_of() { field_of "$1" 0; }
target_of() { field_of "$1" 1; }
unit_of() { field_of "$1" 2; }
int8_unit_of() { field_of "$1" 3; }
log_of() { echo "$logs/$(cpu_of "$1" | tr ',=' '__').shard$2.log"; }

run_one() {  # CPU/TARGET[/UNIT[/INT8_UNIT]] FILTER SHARD: the log, then its exit status and seconds in LOG.status
  local cpu expected unit int8_unit log only=() start rc
  cpu=$(cpu_of "$1") expected=$(target_of "$1") unit=$(unit_of "$1") int8_unit=$(int8_unit_of "$1")
  log=$(log_of "$1" "$3")
  [ $best_only = 1 ] && only=(ATTN_TEST_TARGETS="$expected")
  start=$(date +%s)
  env "${only[@]}" GTEST_TOTAL_SHARDS="$shards" GTEST_SHARD_INDEX="$3" ATTN_TEST_EMULATED=1 \
      ATTN_EXPECT_TARGET="$expected" ATTN_EXPECT_UNIT="$unit" \
      ATTN_EXPECT_INT8_UNIT="$int8_unit" \
      qemu-aarch64 -cpu "$cpu" "$bin" --gtest_filter="$2" >"$log" 2>&1
  rc=$?
  echo "$rc $(( $(date +%s) - start ))" >"$log.status"
}

for i in "${!specs[@]}"; do
  for ((shard = 0; shard < shards; ++shard)); do
    while [ "$(jobs -rp | wc -l)" -ge "$jobs" ]; do wait -n; done
    run_one "${specs[i]}" "${filters[i]}" "$shard" &
  done
done
wait

failed=0
for spec in "${specs[@]}"; do
  passed=0 failures=0 slowest=0 targets=
  for ((shard = 0; shard < shards; ++shard)); do
    log=$(log_of "$spec" "$shard")
    read -r rc seconds <"$log.status"
    # Kernels.SimdTargetsOfThisCpu prints them, in whichever shard runs it.
    targets=${targets:-$(sed -n 's/^SIMD targets of this CPU: //p' "$log")}
    count=$(sed -n 's/^\[  PASSED  \] \([0-9]*\) tests\?\..*/\1/p' "$log")
    passed=$((passed + ${count:-0}))
    failures=$((failures + $(grep -c '^\[  FAILED  \] [A-Za-z]' "$log")))
    ((seconds > slowest)) && slowest=$seconds
    if [ "$rc" -ne 0 ] || [ -z "$count" ]; then
      failed=1
      grep -E '^\[  FAILED  \] [A-Za-z]' "$log" | head -20
      echo "  (whole log: $log)"
    fi
  done
  [ $best_only = 1 ] && targets="$(target_of "$spec") (of: $targets)"
  printf '%-16s targets: %-40s %4s passed, %s failed, %4d s\n' "$(cpu_of "$spec")" "${targets:-?}" \
      "$passed" "$failures" "$slowest"
done
exit $failed
