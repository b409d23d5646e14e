#!/usr/bin/env bash
# Builds the libFuzzer targets (the `fuzz` preset: clang, ASan + UBSan, build-fuzz/) and runs
# each for SECONDS (default 30) from its seed corpus (docs/fuzzing.md). Prints one line per
# target (executions, and whether it found anything) and a "Fuzz: ..." summary line last;
# exits non-zero if any target crashed (a sanitizer report, an uncaught exception, an abort, a
# timeout of 10 s on one input, more than 2 GiB of memory).
#   scripts/fuzz.sh [SECONDS] [TARGET ...]      (targets: fuzz/*.cpp names; default all)
#
# The committed seeds (fuzz/corpus/<target>/) are copied to build-fuzz/corpus/<target>/ first
# and the run grows that copy; crash inputs are written to build-fuzz/crashes/<target>/ and
# logs to build-fuzz/logs/<target>.log. Reproduce a crash with
#   build-fuzz/fuzz_<target> build-fuzz/crashes/<target>/crash-...
# Fuzzing for hours: `scripts/fuzz.sh 3600` (an hour per target, one after another), or one
# target on every core, growing its corpus across runs:
#   build-fuzz/fuzz_<target> -jobs=$(nproc) -workers=$(nproc) -max_total_time=36000 \
#     -rss_limit_mb=2048 -timeout=10 -artifact_prefix=build-fuzz/crashes/<target>/ \
#     build-fuzz/corpus/<target>
# and copy a new, small, interesting input into fuzz/corpus/<target>/ when it is worth keeping.
set -euo pipefail
cd "$(dirname "$0")/.."
secs=${1:-30}
shift || true
[[ $secs =~ ^[0-9]+$ ]] || { echo "fuzz.sh: SECONDS must be a whole number, got '$secs'" >&2; exit 2; }

# clang and libFuzzer's runtime (Debian: clang, libclang-rt-dev, libomp-dev for OpenMP).
if [[ ! -x /usr/bin/clang++ ]] || ! command -v curl >/dev/null || ! compgen -G "/usr/lib/llvm-*/lib/clang/*/lib/linux/libclang_rt.fuzzer-x86_64.a" >/dev/null; then
  scripts/install_deps.sh
fi

# DDILOCO_FUZZ_EXCLUDE="a b": targets left out of a run without names.
targets=("$@")
if ((${#targets[@]} == 0)); then
  for f in fuzz/*.cpp; do
    t=$(basename "$f" .cpp)
    if [[ " ${DDILOCO_FUZZ_EXCLUDE:-} " == *" $t "* ]]; then
      echo "fuzz.sh: $t left out (DDILOCO_FUZZ_EXCLUDE)" >&2
      continue
    fi
    targets+=("$t")
  done
fi

t0=$(date +%s)
# HDF5 1.14, built once into build-fuzz/ (scripts/hdf5_fuzz_lib.sh: why). A cache made against
# another HDF5 (Debian's 1.10.8, by an older checkout) is configured afresh.
hdf5_root=$(scripts/hdf5_fuzz_lib.sh)
if [[ -f build-fuzz/CMakeCache.txt ]] && ! grep -qx "HDF5_DIR:PATH=$hdf5_root/cmake" build-fuzz/CMakeCache.txt; then
  rm -f build-fuzz/CMakeCache.txt
fi
cmake --preset fuzz -DHDF5_ROOT="$hdf5_root" >/dev/null
cmake --build --preset fuzz -j "$(nproc)"
build_s=$(( $(date +%s) - t0 ))
echo "fuzz.sh: fuzz preset built in ${build_s} s"

export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1:symbolize=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
export OMP_NUM_THREADS=1
failed=() total_execs=0 lines=()
for t in "${targets[@]}"; do
  bin=build-fuzz/fuzz_$t
  [[ -x $bin ]] || { echo "fuzz.sh: no target $t ($bin)" >&2; exit 2; }
  corpus=build-fuzz/corpus/$t crashes=build-fuzz/crashes/$t log=build-fuzz/logs/$t.log
  rm -rf "$corpus" && mkdir -p "$corpus" "$crashes" build-fuzz/logs
  if compgen -G "fuzz/corpus/$t/*" >/dev/null; then cp fuzz/corpus/"$t"/* "$corpus"/; fi
  before=$(ls "$crashes" | wc -l)
  # fuzz/<target>.flags: libFuzzer flags of its own (one or more a line; see the file)
  flags=()
  if [[ -f fuzz/$t.flags ]]; then read -r -a flags < <(grep -v '^#' "fuzz/$t.flags" | tr '\n' ' ') || true; fi
  rc=0
  "$bin" -max_total_time="$secs" -rss_limit_mb=2048 -timeout=10 -print_final_stats=1 \
         -artifact_prefix="$crashes/" "${flags[@]}" "$corpus" > "$log" 2>&1 || rc=$?
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -n 1)
  execs=${execs:-0}
  total_execs=$((total_execs + execs))
  new=$(( $(ls "$crashes" | wc -l) - before ))
  if ((rc != 0 || new > 0)); then
    failed+=("$t")
    what=$(grep -m1 -E '^==[0-9]+== ?ERROR|runtime error|terminate called|timeout after|out-of-memory|malloc\(|^fuzz_[a-z_]+:' "$log" || true)
    line="fuzz $t: $execs executions, FOUND A CRASH (exit $rc): ${what:-see $log}; input in $crashes/"
  else
    line="fuzz $t: $execs executions in $secs s, $(ls "$corpus" | wc -l) corpus inputs, nothing found"
  fi
  echo "fuzz.sh: $line" >&2
  lines+=("$line")
done

echo
printf '%s\n' "${lines[@]}"
if ((${#failed[@]})); then
  echo "Fuzz: ${#failed[@]} of ${#targets[@]} targets crashed (${failed[*]}); $total_execs executions, ${secs} s per target, build ${build_s} s"
  exit 1
fi
echo "Fuzz: ${#targets[@]} targets, nothing found; $total_execs executions, ${secs} s per target, build ${build_s} s"
