#!/usr/bin/env bash
# The test command: installs what is missing, builds, runs the whole suite (unit, MPI and
# end-to-end tests) and prints ctest's summary line, then for each suite how many tests
# passed, failed and were skipped (ctest counts a skipped test among the passed in its own
# percentage; a GPU test on a machine without a device is skipped, never passed).
#   scripts/test.sh [preset] [extra ctest arguments]      (preset: release | debug | asan)
#
# With the release preset, where the CUDA toolkit is installed (nvcc at $CUDACXX or
# /usr/local/cuda/bin/nvcc), it then also builds the `cuda` preset's GPU targets (the GPU
# library, the binary and the GPU test programs, not the CPU tests a second time) and runs
# `ctest -L gpu`, whose tests skip where there is no GPU; both suites' summary lines are
# printed last. DDILOCO_CI_CUDA=0 leaves the cuda preset out.
#
# With the release preset it also runs the fuzz targets for 30 s each after the CPU suite
# (scripts/fuzz.sh 30: builds the `fuzz` preset with clang, docs/fuzzing.md) and prints a
# "Fuzz: ..." line beside the suites' lines; a crash fails the script. DDILOCO_CI_FUZZ=0 leaves
# it out.
set -euo pipefail
cd "$(dirname "$0")/.."
preset=${1:-release}
shift || true
scripts/install_deps.sh
scripts/build.sh "$preset"
source scripts/mpi_env.sh

nvcc=${CUDACXX:-/usr/local/cuda/bin/nvcc}
with_cuda=0
if [[ $preset == release && ${DDILOCO_CI_CUDA:-1} != 0 && -x $nvcc ]]; then with_cuda=1; fi

# Both suites run even when the first fails; the exit status is non-zero if either did.
logs=build/ci
mkdir -p "$logs"
cpu_rc=0
ctest --preset "$preset" "$@" 2>&1 | tee "$logs/ctest_cpu.log" || cpu_rc=$?

fuzz_rc=0
with_fuzz=0
if [[ $preset == release && ${DDILOCO_CI_FUZZ:-1} != 0 ]]; then
  with_fuzz=1
  echo "test.sh: fuzz targets, 30 s each (scripts/fuzz.sh 30)"
  t0=$(date +%s)
  # Every target (fuzz/*.cpp); DDILOCO_FUZZ_EXCLUDE="a b" leaves some out.
  scripts/fuzz.sh 30 2>&1 | tee "$logs/fuzz.log" || fuzz_rc=$?
  echo "test.sh: fuzz build and pass took $(( $(date +%s) - t0 )) s"
fi

gpu_rc=0
if [[ $with_cuda == 1 ]]; then
  echo "test.sh: cuda preset (GPU targets only; $nvcc)"
  t0=$(date +%s)
  gpu_targets=(ddiloco ddiloco_gpu_tests)
  for f in tests/gpu/mpi/*.cpp; do
    [[ -e $f ]] && gpu_targets+=("gpu_$(basename "$f" .cpp)")
  done
  if cmake --preset cuda -DCMAKE_CUDA_COMPILER="$nvcc" -DDDILOCO_BUILD_BENCH=OFF >/dev/null &&
     cmake --build --preset cuda -j "$(nproc)" --target "${gpu_targets[@]}"; then
    echo "test.sh: cuda preset built in $(( $(date +%s) - t0 )) s"
    ctest --preset cuda -L gpu 2>&1 | tee "$logs/ctest_gpu.log" || gpu_rc=$?
  else
    gpu_rc=1
    echo "test.sh: the cuda preset failed to configure or build" | tee "$logs/ctest_gpu.log"
  fi
fi

summary() { grep -E 'tests passed|tests failed|No tests were found|failed to' "$1" | tail -n 1; }
# counts LOG: passed, failed and skipped, from ctest's line per test
# ("  3/62 Test  #3: name ....   Passed    0.01 sec", "***Skipped", "***Failed", "***Timeout", ...).
counts() {
  awk '/^ *[0-9]+\/[0-9]+ +Test +#[0-9]+: / {
         n++
         if ($0 ~ / Passed +[0-9.]+ sec$/) p++; else if ($0 ~ /\*\*\*Skipped /) s++; else f++
       }
       END { printf "%d passed, %d failed, %d skipped of %d", p, f, s, n }' "$1"
}
echo
if [[ $with_cuda == 1 ]]; then
  echo "GPU suite (cuda preset, ctest -L gpu): $(counts "$logs/ctest_gpu.log") | $(summary "$logs/ctest_gpu.log")"
elif [[ $preset != release ]]; then
  echo "GPU suite: not run (the $preset preset builds no GPU code)"
elif [[ ${DDILOCO_CI_CUDA:-1} == 0 ]]; then
  echo "GPU suite: not run (DDILOCO_CI_CUDA=0)"
else
  echo "GPU suite: not run (no CUDA toolkit: $nvcc not found)"
fi
if [[ $with_fuzz == 1 ]]; then
  fuzz_line=$(grep -E '^Fuzz: ' "$logs/fuzz.log" | tail -n 1 || true)
  echo "${fuzz_line:-Fuzz: the fuzz preset failed to configure or build (see $logs/fuzz.log)}"
elif [[ $preset != release ]]; then
  echo "Fuzz: not run (only with the release preset)"
else
  echo "Fuzz: not run (DDILOCO_CI_FUZZ=0)"
fi
echo "CPU suite ($preset preset): $(counts "$logs/ctest_cpu.log") | $(summary "$logs/ctest_cpu.log")"
((cpu_rc == 0 && gpu_rc == 0 && fuzz_rc == 0))
