#!/usr/bin/env bash
# The device check, for a machine with an NVIDIA GPU and possibly no package access:
#   1. dependencies: the system's Debian/Ubuntu packages if all are there, else the carried
#      ones (.debs/, unpacked from .debs.tar.gz; made by scripts/pack_gpu_debs.sh); NCCL from
#      the CUDA toolkit, NCCL_ROOT, or the nvidia-nccl Python wheel;
#   2. configures and builds the `cuda` preset (ninja when present, all cores);
#   3. runs the GPU tests (ctest -L gpu, but for step 5's) and the CPU parity tests (-R Parity);
#   4. `ddiloco bench gpu --compare` on a GPT-2 124M-shaped model at B = 16, 32 and 64: tokens/s,
#      MFU and GPU memory of every kernel variant side by side (cuDNN's fused attention among
#      them where the build found cuDNN 9);
#   5. tests/e2e/gpu_train.sh: the trainer on the GPU, among others a 4-unit decoupled run
#      sharing the one GPU (tokens/s printed).
# Logs go to ${OUT:-build-cuda/gpu_check}: summary.txt and at most 7 *.log (a device tool's
# $OUT returns 8 files). Exits non-zero on any failure: at once when a step cannot go on
# (dependencies, build, benchmark, decoupled run), at the end for failed tests (so that one
# run still measures); without a GPU the build and the (skipped) GPU tests run, then the
# script fails saying that no GPU step could run.
#
#   scripts/gpu_check.sh                 everything
#   scripts/gpu_check.sh --build-only    steps 1-2 (and the GPU tests, which skip without a GPU)
#   scripts/gpu_check.sh --debs          use the carried packages even where the system has them
# Environment: BENCH_BATCH (default 16), BENCH_SEQ (1024), BENCH_STEPS (20), BENCH_WARMUP (3),
# BENCH_ARGS (more `bench gpu` flags, e.g. "--attention cudnn"), BENCH_EXTRA_BATCHES (default
# "32 64": every variant again at these batches), BENCH_EXTRA_COMPARE (1; 0: only the default
# variant at the extra batches), JOBS (default nproc), CUDA_ARCH (default: the preset's 90).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD

build_only=0
force_debs=0
for arg in "$@"; do
  case "$arg" in
    --build-only) build_only=1 ;;
    --debs) force_debs=1 ;;
    -h|--help) sed -n '2,24p' "$0"; exit 0 ;;
    *) echo "gpu_check: unknown argument '$arg' (see --help)" >&2; exit 2 ;;
  esac
done

logs=${OUT:-$root/build-cuda/gpu_check}
mkdir -p "$logs"
logs=$(cd "$logs" && pwd)
summary=$logs/summary.txt
rm -f "$logs"/*.log
: >"$summary"
t0=$(date +%s)
say() { echo "gpu_check: $*" | tee -a "$summary"; }
elapsed() { echo "$(( $(date +%s) - t0 )) s"; }
# Failed checks that need not stop the later ones (device time is scarce: one run should
# report every failure and still measure); the script fails at the end if there are any.
failures=()
failed() { say "FAILED (going on): $*"; failures+=("$*"); }
die() {
  say "FAILED: $*"
  if ((${#failures[@]} > 0)); then say "failed before: ${failures[*]}"; fi
  say "logs: $logs"
  exit 1
}
# Runs a command with its output appended to log file $1; on failure prints the log's tail and
# returns the command's status.
run_logged() {
  local log=$logs/$1 rc=0
  shift
  echo "+ $*" >>"$log"
  "$@" >>"$log" 2>&1 || rc=$?
  ((rc == 0)) || tail -n 60 "$log"
  return "$rc"
}

say "start $(date -u "+%Y-%m-%d %H:%M:%S UTC") on ${HOSTNAME:-?}, $(nproc) cores"
if command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null 2>&1; then
  say "GPU: $(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | head -n1)"
else
  say "GPU: none found (nvidia-smi -L failed or is missing)"
fi

# ------------------------------------------------------------------ 1. dependencies
export PATH=/usr/local/cuda/bin:$PATH
command -v nvcc >/dev/null || die "nvcc not found (looked in PATH and /usr/local/cuda/bin)"
say "nvcc: $(nvcc --version | sed -n 's/.*release \([0-9.]*\).*/\1/p'), cmake: $(cmake --version | head -n1 | awk '{print $3}')"

# What CMakeLists.txt needs from the system; any one missing means: use the carried packages
# (all of them, so that versions do not mix).
system_has_deps() {
  local f
  command -v mpicc >/dev/null && command -v mpirun >/dev/null || return 1
  for f in /usr/include/hdf5/serial/hdf5.h /usr/include/yaml-cpp/yaml.h \
           /usr/include/nlohmann/json.hpp /usr/include/CLI/CLI.hpp /usr/include/fmt/core.h \
           /usr/include/gtest/gtest.h /usr/include/gmock/gmock.h \
           /usr/include/benchmark/benchmark.h \
           /usr/include/x86_64-linux-gnu/openblas-openmp/cblas.h; do
    [[ -e $f ]] || return 1
  done
}

cmake_extra=()
if [[ $force_debs == 1 ]] || ! system_has_deps; then
  if [[ ! -f .debs/env.sh ]]; then
    [[ -f .debs.tar.gz ]] || die "the system lacks build packages (MPI, HDF5, yaml-cpp, ...) and
  there is no .debs.tar.gz: run scripts/pack_gpu_debs.sh on a Debian 12 machine with package
  access and bring .debs.tar.gz (carry it) here"
    say "unpacking .debs.tar.gz"
    tar -xzf .debs.tar.gz
  fi
  # shellcheck disable=SC1091
  source .debs/env.sh
  run_logged deps.log .debs/check-target.sh ||
    die "the carried packages do not fit this machine (.debs/check-target.sh)"
  # CMakeLists.txt looks for the OpenMP OpenBLAS at Debian's fixed path; point it into .debs.
  cmake_extra+=(
    "-DDDILOCO_OPENBLAS=$root/.debs/root/usr/lib/x86_64-linux-gnu/openblas-openmp/libopenblas.so"
    "-DDDILOCO_CBLAS_INCLUDE=$root/.debs/root/usr/include/x86_64-linux-gnu/openblas-openmp")
  say "dependencies: carried Debian 12 packages in .debs/ (mpirun: $(command -v mpirun))"
else
  say "dependencies: the system's packages"
fi
# shellcheck source=scripts/mpi_env.sh
source scripts/mpi_env.sh

# NCCL: in the CUDA toolkit here; elsewhere NCCL_ROOT, or the wheel PyTorch brings
# (nvidia-nccl-cu1x: .../nvidia/<...>/{include/nccl.h,lib/libnccl.so.2}), whose lib has only
# libnccl.so.2: a folder of links gives CMake the libnccl.so it looks for.
find_nccl_wheel='
import os, nvidia
for base in nvidia.__path__:
    for top, dirs, files in os.walk(base):
        prefix = os.path.dirname(top)
        if "nccl.h" in files and os.path.basename(top) == "include" and \
           os.path.exists(os.path.join(prefix, "lib", "libnccl.so.2")):
            print(prefix)
            raise SystemExit'
if [[ -z ${NCCL_ROOT:-} && ! -e /usr/local/cuda/include/nccl.h && ! -e /usr/include/nccl.h ]]; then
  wheel=$(python3 -c "$find_nccl_wheel" 2>/dev/null || true)
  [[ -n $wheel ]] ||
    die "NCCL not found: not in /usr/local/cuda or /usr/include, NCCL_ROOT unset, no nvidia-nccl wheel"
  shim=$root/build-cuda/nccl
  mkdir -p "$shim/lib"
  ln -sfn "$wheel/include" "$shim/include"
  ln -sfn "$wheel/lib/libnccl.so.2" "$shim/lib/libnccl.so"
  export NCCL_ROOT=$shim LD_LIBRARY_PATH=$wheel/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  say "NCCL: the Python wheel at $wheel"
fi
[[ -n ${NCCL_ROOT:-} ]] && cmake_extra+=("-DNCCL_ROOT=$NCCL_ROOT")
[[ -n ${CUDA_ARCH:-} ]] && cmake_extra+=("-DCMAKE_CUDA_ARCHITECTURES=$CUDA_ARCH")
# The nvcc on PATH rather than the preset's fixed /usr/local/cuda/bin/nvcc; no Google
# Benchmark micro-benchmarks (not part of the check: build time).
cmake_extra+=("-DCMAKE_CUDA_COMPILER=$(command -v nvcc)" -DDDILOCO_BUILD_BENCH=OFF)

# ------------------------------------------------------------------ 2. configure and build
jobs=${JOBS:-$(nproc)}
generator=()
if [[ ! -f build-cuda/CMakeCache.txt ]] && command -v ninja >/dev/null; then generator=(-G Ninja); fi
say "configure: cmake --preset cuda ${generator[*]} ${cmake_extra[*]}"
run_logged configure.log cmake --preset cuda "${generator[@]}" "${cmake_extra[@]}" ||
  die "configure (log: configure.log)"
# Whether run.gpu_attention: cudnn is in this build (cmake/cuda.cmake says which cuDNN).
say "$(grep -m1 -E -- '-- cuDNN' "$logs/configure.log" | sed 's/^-- //' || echo 'cuDNN: not reported')"
tb=$(date +%s)
run_logged build.log cmake --build build-cuda -j "$jobs" || die "build (log: build.log)"
say "built in $(( $(date +%s) - tb )) s with $jobs jobs (total $(elapsed))"

# ------------------------------------------------------------------ 3. tests
have_gpu=0
if nvidia-smi -L >/dev/null 2>&1 || [[ -e /dev/nvidia0 ]]; then have_gpu=1; fi
# ctest's summary line ("100% tests passed, 0 tests failed out of N") goes to the summary.
ctest_step() {
  local log=$1
  shift
  local rc=0
  run_logged "$log" ctest --test-dir build-cuda --output-on-failure "$@" || rc=$?
  grep -E 'tests passed|tests failed|No tests were found' "$logs/$log" | tail -n 1 |
    sed 's/^/  /' | tee -a "$summary"
  local skipped
  skipped=$(grep -c '(Skipped)$' "$logs/$log" || true)
  ((skipped == 0)) || say "  ($skipped tests skipped; see $log)"
  return "$rc"
}
# e2e_gpu_train (tests/e2e/gpu_train.sh) is step 5, run once, with its own log.
say "GPU tests: ctest -L gpu -E '^e2e_gpu_train\$'"
if [[ $build_only == 1 ]]; then
  ctest_step ctest_gpu.log -L gpu -E '^e2e_gpu_train$' || die "GPU tests (log: ctest_gpu.log)"
  say "--build-only: the CPU parity tests, the benchmark and the decoupled run were not run"
  say "done in $(elapsed)"
  exit 0
fi
ctest_step ctest_gpu.log -L gpu -E '^e2e_gpu_train$' || failed "GPU tests (log: ctest_gpu.log)"
[[ $have_gpu == 1 ]] || die "no GPU on this machine: the GPU tests above were SKIPPED, and the
  benchmark and the decoupled run cannot run; this was not a device check (use --build-only)"
say "CPU parity tests: ctest -R Parity"
ctest_step ctest_cpu.log -R Parity || failed "CPU parity tests (log: ctest_cpu.log)"

# ------------------------------------------------------------------ 4. benchmark (GPT-2 124M)
batch=${BENCH_BATCH:-16}
seq=${BENCH_SEQ:-1024}
if ! build-cuda/ddiloco bench gpu --help >/dev/null 2>&1; then
  die "ddiloco bench gpu: not in this build"
fi
# bench gpu's defaults are the GPT-2 124M shape (12 layers, 12 heads, 768 channels, the
# vocabulary padded to 50304); MFU against --peak-tflops (989: H100/H200 SXM dense bf16).
# --compare: every kernel variant side by side (attention kinds, cudnn among them where the
# build found cuDNN, × GELU fused or separate), each row with the GPU memory in use.
# bench_at B [--compare]: one run at batch B; its compare table, memory and summary line go to
# the summary.
bench_at() {
  local b=$1
  shift
  # shellcheck disable=SC2206  # BENCH_ARGS: extra flags, split on purpose
  local cmd=(build-cuda/ddiloco bench gpu --batch "$b" --seq "$seq"
    --steps "${BENCH_STEPS:-20}" --warmup "${BENCH_WARMUP:-3}" "$@" ${BENCH_ARGS:-})
  say "benchmark: ${cmd[*]}"
  # One log for every batch (the device tool returns 8 files): this run's part follows its
  # "+ command" line.
  run_logged bench_gpu.log "${cmd[@]}" || die "ddiloco bench gpu --batch $b (log: bench_gpu.log)"
  local run=$logs/bench_gpu.last
  awk '/^\+ / { n = 0; delete l } { l[n++] = $0 } END { for (i = 0; i < n; i++) print l[i] }' \
    "$logs/bench_gpu.log" >"$run"
  grep -E '^bench gpu: (cuDNN|built without)|^compare: attention .* left out' "$run" |
    sed 's/^/  /' | tee -a "$summary" || true
  sed -n '/^compare: [0-9]/,/^$/p' "$run" | sed 's/^/  /' | tee -a "$summary"
  tail -n 8 "$run"
  local last
  last=$(grep -E '^batch=[0-9]+ seq_len=[0-9]+ tokens_per_s=' "$run" | tail -n 1 || true)
  [[ -n $last ]] || die "ddiloco bench gpu printed no 'batch=... tokens_per_s=... mfu=...' line"
  say "GPT-2 124M shape: $last; $(grep -E '^device memory in use' "$run" | tail -n 1)"
  rm -f "$run"
}
bench_at "$batch" --compare
# Larger batches (BENCH_EXTRA_BATCHES, "" for none): fixed per-step costs (AdamW, launches)
# spread over more tokens, and llm.c's 64 × 1024 per GPU. Every variant again unless
# BENCH_EXTRA_COMPARE=0 (then the default variant only: shorter).
extra_compare=(--compare)
[[ ${BENCH_EXTRA_COMPARE:-1} == 0 ]] && extra_compare=()
for b in ${BENCH_EXTRA_BATCHES-32 64}; do
  bench_at "$b" "${extra_compare[@]}"
done

# ------------------------------------------------------------------ 5. 4-unit decoupled run
# tests/e2e/gpu_train.sh: (a) mode single on the GPU against the CPU, (b) decoupled with 4
# one-rank units sharing the GPU and the syncer on the CPU (mpirun -np 5), (c) a NaN unit that
# rejoins, (d) streaming with carry, checkpoint and resume; it prints the tokens/s of (a), (b).
gpu_train=(bash tests/e2e/gpu_train.sh build-cuda/ddiloco .)
say "4-unit decoupled GPU run (and the trainer's other GPU checks): ${gpu_train[*]}"
td=$(date +%s)
rc=0
run_logged decoupled.log "${gpu_train[@]}" || rc=$?
grep -E '^\((a|b)\) ' "$logs/decoupled.log" | sed 's/^/  /' | tee -a "$summary" || true
if ((rc == 77)); then
  die "tests/e2e/gpu_train.sh skipped itself on a machine with a GPU: $(grep SKIP "$logs/decoupled.log")"
fi
((rc == 0)) || die "4-unit decoupled GPU run (log: decoupled.log)"
say "4-unit decoupled GPU run: passed in $(( $(date +%s) - td )) s"
if ((${#failures[@]} > 0)); then
  say "FAILED: ${failures[*]}"
  say "logs: $logs"
  exit 1
fi
say "all checks passed in $(elapsed); logs: $logs"
