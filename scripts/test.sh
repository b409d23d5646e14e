#!/usr/bin/env bash
# The test command: installs what is missing, builds, runs the whole suite (unit, MPI and
# end-to-end tests) and prints ctest's summary line.
#   scripts/test.sh [preset] [extra ctest arguments]      (preset: release | debug | asan)
set -euo pipefail
cd "$(dirname "$0")/.."
preset=${1:-release}
shift || true
scripts/install_deps.sh
scripts/build.sh "$preset"
source scripts/mpi_env.sh
ctest --preset "$preset" "$@"
