#!/usr/bin/env bash
# The test command: installs what is missing, builds, runs the whole suite (unit, MPI and
# end-to-end tests) and prints ctest's summary line.
#   scripts/test.sh [preset] [extra ctest arguments]      (preset: release | debug | asan)
#
# With the release preset, where the CUDA toolkit is installed (nvcc at $CUDACXX or
# /usr/local/cuda/bin/nvcc), it then also builds the `cuda` preset's GPU targets (the GPU
# library, the binary and the GPU test programs, not the CPU tests a second time) and runs
# `ctest -L gpu`, whose tests skip where there is no GPU; both suites' summary lines are
# printed last. DDILOCO_CI_CUDA=0 leaves the cuda preset out.
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
if [[ $with_cuda == 0 ]]; then exec ctest --preset "$preset" "$@"; fi

# Both suites run even when the first fails; the exit status is non-zero if either did.
logs=build/ci
mkdir -p "$logs"
cpu_rc=0
ctest --preset "$preset" "$@" 2>&1 | tee "$logs/ctest_cpu.log" || cpu_rc=$?

echo "test.sh: cuda preset (GPU targets only; $nvcc)"
gpu_rc=0
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

summary() { grep -E 'tests passed|tests failed|No tests were found|failed to' "$1" | tail -n 1; }
echo
echo "GPU suite (cuda preset, ctest -L gpu): $(summary "$logs/ctest_gpu.log")"
echo "CPU suite ($preset preset): $(summary "$logs/ctest_cpu.log")"
((cpu_rc == 0 && gpu_rc == 0))
