#!/usr/bin/env bash
# Builds the HDF5 C library that the `fuzz` preset links (docs/fuzzing.md, "libhdf5"):
# Debian 13's source of HDF5 1.14.5, fetched from Debian's archive and checked against the
# SHA-256 that trixie's Sources index gives for it, configured as Debian configures the C
# library (zlib, no szip, thread-safety off), without the tools, tests, C++, Fortran and HL
# parts. It is not instrumented, as Debian's package is not: the fuzz targets exercise
# ddiloco's readers, and the library's own faults show as a SEGV or in an intercepted call.
# It keeps frame pointers, so that ASan's stacks (and leak suppressions by function,
# fuzz/h5_readers.cpp) reach through its frames.
#
# Why: Debian 12's libhdf5 1.10.8 reads out of bounds while decoding a corrupt attribute
# message (H5O_attr_decode) before any call of its API lets ddiloco check the file, so the
# h5_readers target could not run clean against it; HDF5 1.14 checks those messages.
#
#   scripts/hdf5_fuzz_lib.sh [PREFIX]     (default build-fuzz/hdf5-1.14.5; prints PREFIX)
# Does nothing when PREFIX already holds the library. Needs cmake, a C compiler, curl, zlib.
set -euo pipefail
# PREFIX as the caller meant it (relative to the caller's directory), before the cd.
prefix=${1:+$(realpath -m -- "$1")}
cd "$(dirname "$0")/.."
prefix=${prefix:-$PWD/build-fuzz/hdf5-1.14.5}
if [[ -e $prefix && ! -d $prefix ]]; then
  echo "hdf5_fuzz_lib.sh: $prefix exists and is not a directory; give another PREFIX" >&2
  exit 2
fi
version=1.14.5+repack
sha256=71cdb04c151ef4e8a7f88907adfc4f3b75afd44e96fbd55775e1c9d7c4e7c112
url=http://deb.debian.org/debian/pool/main/h/hdf5/hdf5_${version}.orig.tar.gz

# What was built: a prefix with another stamp (an older version of this script) is rebuilt.
stamp="$version sha256:${sha256:0:12} -O2 -g -DNDEBUG -fno-omit-frame-pointer"
if [[ -f $prefix/lib/libhdf5.so && "$(cat "$prefix/.ddiloco-stamp" 2>/dev/null)" == "$stamp" ]]; then
  echo "$prefix"
  exit 0
fi
# Only a prefix this script made (or an empty one) is replaced.
if [[ -d $prefix && ! -f $prefix/.ddiloco-stamp && -n "$(ls -A "$prefix")" ]]; then
  echo "hdf5_fuzz_lib.sh: $prefix exists and was not made by this script; give another PREFIX" >&2
  exit 2
fi
work=$(mktemp -d "${TMPDIR:-/tmp}/ddiloco-hdf5.XXXXXX")
trap 'rm -rf "$work"' EXIT
echo "hdf5_fuzz_lib.sh: fetching $url" >&2
if ! curl -fsSL --retry 3 -o "$work/src.tar.gz" "$url"; then
  echo "hdf5_fuzz_lib.sh: cannot fetch $url (Debian's archive); the h5_readers target needs it" >&2
  exit 3
fi
echo "$sha256  $work/src.tar.gz" | sha256sum -c --quiet - >&2 || {
  echo "hdf5_fuzz_lib.sh: $url does not have the SHA-256 $sha256 of Debian 13's Sources index" >&2
  exit 3
}
tar -xzf "$work/src.tar.gz" -C "$work"
src=$(find "$work" -mindepth 2 -maxdepth 2 -name CMakeLists.txt -printf '%h\n' | head -n 1)
[[ -n $src ]] || { echo "hdf5_fuzz_lib.sh: no CMakeLists.txt in $url" >&2; exit 3; }
echo "hdf5_fuzz_lib.sh: building HDF5 ${version%+*} into $prefix" >&2
rm -rf "$prefix"
cmake -S "$src" -B "$work/build" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DCMAKE_C_FLAGS_RELWITHDEBINFO="-O2 -g -DNDEBUG -fno-omit-frame-pointer" \
  -DCMAKE_INSTALL_PREFIX="$prefix" -DBUILD_SHARED_LIBS=ON -DBUILD_STATIC_LIBS=OFF \
  -DBUILD_TESTING=OFF -DHDF5_BUILD_TOOLS=OFF -DHDF5_BUILD_UTILS=OFF -DHDF5_BUILD_EXAMPLES=OFF \
  -DHDF5_BUILD_HL_LIB=OFF -DHDF5_BUILD_CPP_LIB=OFF -DHDF5_BUILD_FORTRAN=OFF \
  -DHDF5_BUILD_JAVA=OFF -DHDF5_ENABLE_Z_LIB_SUPPORT=ON -DHDF5_ENABLE_SZIP_SUPPORT=OFF \
  -DHDF5_ENABLE_PARALLEL=OFF -DHDF5_ENABLE_THREADSAFE=OFF >"$work/configure.log" 2>&1 || {
  tail -n 30 "$work/configure.log" >&2
  exit 1
}
nice cmake --build "$work/build" -j "$(nproc)" >"$work/build.log" 2>&1 || { tail -n 30 "$work/build.log" >&2; exit 1; }
cmake --install "$work/build" >/dev/null
echo "$stamp" >"$prefix/.ddiloco-stamp"
echo "$prefix"
