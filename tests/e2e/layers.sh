# The layers of src/ point one way, and the build enforces it (cmake/check_layers.py, run by
# the CMake target check_layers before the core library; docs/architecture.md, "Layers").
#   1. This tree passes the check.
#   2. A copy of it with one wrong-way include planted (src/util/rng.cpp including
#      ddiloco/syncer_core.hpp of src/syncer) fails to build: CMake configures the copy and
#      building the layer's library stops at the check, naming the file and the header. So
#      does an include between the two roles, side by side (src/learner including the
#      syncer's core).
#   3. Nor can an include slip past written as <ddiloco/x.hpp> or as a path relative to the
#      file ("../syncer/syncer.hpp").
#   4. A folder of src/ that is not placed in the order fails the check, and so does a folder
#      inside a layer (CMake builds src/<layer>/*.cpp: its files would never be compiled).
source "$(dirname "$0")/lib/common.sh"

/usr/bin/python3 "$SRC/cmake/check_layers.py" "$SRC" || fail "this tree has wrong-way includes (above)"
echo "ok: every include of src/ points down"

copy=$WORK/tree
mkdir -p "$copy"
cp -r "$SRC/CMakeLists.txt" "$SRC/CMakePresets.json" "$SRC/cmake" "$SRC/include" "$SRC/src" \
      "$SRC/kernels" "$copy/"
sed -i '1i #include "ddiloco/syncer_core.hpp"  // planted: util must not use the syncer' "$copy/src/util/rng.cpp"
cmake -S "$copy" -B "$copy/build" -DDDILOCO_BUILD_TESTS=OFF -DDDILOCO_BUILD_BENCH=OFF \
      > "$WORK/configure.log" 2>&1 || { cat "$WORK/configure.log"; fail "the copy did not configure"; }
if cmake --build "$copy/build" --target ddiloco_util > "$WORK/build.log" 2>&1; then
  fail "a wrong-way include built (log: $WORK/build.log)"
fi
grep -q "src/util/rng.cpp includes ddiloco/syncer_core.hpp" "$WORK/build.log" ||
  { cat "$WORK/build.log"; fail "the build failed, but not on the planted include"; }
if ls "$copy/build"/CMakeFiles/ddiloco_*.dir/src/*/*.o > /dev/null 2>&1; then
  fail "a layer was compiled before the check"
fi
echo "ok: the planted wrong-way include failed the build: $(grep -m1 'rng.cpp includes' "$WORK/build.log")"

sed -i '1d' "$copy/src/util/rng.cpp"
sed -i '1i #include "ddiloco/syncer_core.hpp"  // planted: the learner must not use the syncer' \
  "$copy/src/learner/learner_hooks.cpp"
if cmake --build "$copy/build" --target ddiloco_learner > "$WORK/build2.log" 2>&1; then
  fail "an include between the two roles built (log: $WORK/build2.log)"
fi
grep -q "src/learner/learner_hooks.cpp includes ddiloco/syncer_core.hpp: .* beside src/learner" "$WORK/build2.log" ||
  { cat "$WORK/build2.log"; fail "the build failed, but not on the include between the roles"; }
echo "ok: an include between the roles failed the build: $(grep -m1 'learner_hooks.cpp includes' "$WORK/build2.log")"

sed -i '1d' "$copy/src/learner/learner_hooks.cpp"
sed -i '1i #include <ddiloco/syncer_core.hpp>' "$copy/src/util/rng.cpp"
sed -i '1i #include "../syncer/syncer.hpp"' "$copy/src/learner/learner_hooks.cpp"
if /usr/bin/python3 "$SRC/cmake/check_layers.py" "$copy" 2> "$WORK/forms.log"; then
  fail "an angle-bracket or relative wrong-way include passed"
fi
grep -q "src/util/rng.cpp includes ddiloco/syncer_core.hpp" "$WORK/forms.log" &&
  grep -q "src/learner/learner_hooks.cpp includes syncer/syncer.hpp: .* beside src/learner" "$WORK/forms.log" ||
  { cat "$WORK/forms.log"; fail "wrong message for <...> or relative includes"; }
echo "ok: <ddiloco/...> and relative wrong-way includes fail the check too"
sed -i '1d' "$copy/src/util/rng.cpp" "$copy/src/learner/learner_hooks.cpp"

# check_fails WHAT PATTERN: the check refuses the copy, with a line matching PATTERN.
check_fails() {
  if /usr/bin/python3 "$SRC/cmake/check_layers.py" "$copy" 2> "$WORK/check.log"; then
    fail "$1 passed"
  fi
  grep -q "$2" "$WORK/check.log" || { cat "$WORK/check.log"; fail "wrong message for $1"; }
  echo "ok: $1 fails the check"
}
mkdir "$copy/src/learner/sub"
check_fails "a folder inside a layer" "src/learner/sub: a folder inside a layer"
rmdir "$copy/src/learner/sub"
mkdir "$copy/src/newfolder"
check_fails "an unplaced folder" "src/newfolder: a folder not in LAYERS"
echo "PASS: the layers point one way, and the build enforces it"
