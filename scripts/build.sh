#!/usr/bin/env bash
# Configures and builds a CMake preset (default: release) with all cores; with targets, only
# those (and what they need).
#   scripts/build.sh [preset] [target ...]
set -euo pipefail
cd "$(dirname "$0")/.."
preset=${1:-release}
shift || true
cmake --preset "$preset" >/dev/null
if (($#)); then
  cmake --build --preset "$preset" -j "$(nproc)" --target "$@"
else
  cmake --build --preset "$preset" -j "$(nproc)"
fi
