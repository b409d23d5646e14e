#!/usr/bin/env bash
# Packs the Debian 12 packages the cuda preset's build needs into .debs/ and .debs.tar.gz
# (both git-ignored), for a GPU machine without package access: scripts/gpu_check.sh unpacks
# the archive into .debs/ there and sources .debs/env.sh when the machine lacks the packages.
# Uses ../shared/tools/carry-debs (or $CARRY_DEBS): the packages are unpacked with dpkg -x into
# .debs/root, never into /, and env.sh sets PATH, LD_LIBRARY_PATH, CPATH, CMAKE_PREFIX_PATH,
# PKG_CONFIG_PATH and OPAL_PREFIX relative to wherever .debs lies.
#
#   scripts/pack_gpu_debs.sh            writes .debs/ and .debs.tar.gz (replaces old ones)
#   scripts/pack_gpu_debs.sh --check    only prints the archive's size
#
# Carry the ARCHIVE (about 35 MiB), not the folder (about 100 MiB unpacked: OpenBLAS alone is
# 35 MiB): the device tool moves at most 64 MiB, working tree included.
#
# What is carried: what CMakeLists.txt finds (MPI, HDF5, yaml-cpp, nlohmann-json, CLI11, fmt,
# OpenBLAS's OpenMP build, GoogleTest/GoogleMock, Google Benchmark) and mpirun. Not carried:
# the compiler, CMake, ninja, CUDA and NCCL (the GPU machine's image has them; NCCL alone is
# 218 MB). The folder must stay well under the device tool's 64 MiB (working tree included).
set -euo pipefail
cd "$(dirname "$0")/.."

limit_mib=50
packages="libopenmpi-dev openmpi-bin libhdf5-dev libyaml-cpp-dev nlohmann-json3-dev libcli11-dev"
packages+=" libfmt-dev libopenblas-openmp-dev libgtest-dev libgmock-dev libbenchmark-dev"

size_report() {
  local mib
  mib=$(( ($(stat -c %s .debs.tar.gz) + 1048575) / 1048576 ))
  echo "pack_gpu_debs: .debs.tar.gz is ${mib} MiB ($(du -sm --apparent-size .debs | cut -f1) MiB unpacked)"
  if ((mib > limit_mib)); then
    echo "pack_gpu_debs: error: over ${limit_mib} MiB; the device tool carries 64 MiB in all" >&2
    return 1
  fi
}

case "${1:-}" in
  --check) [[ -f .debs.tar.gz && -f .debs/env.sh ]] || { echo "pack_gpu_debs: no .debs.tar.gz" >&2; exit 1; }
           size_report; exit ;;
  -h|--help) sed -n '2,16p' "$0"; exit 0 ;;
  "") ;;
  *) echo "pack_gpu_debs: unknown argument '$1' (expected --check)" >&2; exit 2 ;;
esac

carry=${CARRY_DEBS:-../shared/tools/carry-debs}
[[ -x $carry ]] || carry=/work/shared/tools/carry-debs
[[ -x $carry ]] || { echo "pack_gpu_debs: carry-debs not found (set CARRY_DEBS)" >&2; exit 1; }
# carry-debs refuses a folder it did not write: remove only an earlier output of its own.
if [[ -e .debs && ! -f .debs/.carry-debs ]]; then
  echo "pack_gpu_debs: .debs exists and is not a carry-debs output; move it away" >&2; exit 1
fi
"$carry" --out .debs --force --tar --packages "$packages"
size_report
