# The module layers point one way (README "Layout"): configuration, wire formats and transport,
# data and files (src/util, src/comm, src/data, src/io) do not depend on the protocol, the
# training loop or the GPU side above them (src/sync, src/train, src/gpu), and the training
# loop does not depend on the protocol that drives it. No file of a lower directory includes,
# directly or through the headers it includes, a header that an upper one implements.
source "$(dirname "$0")/lib/common.sh"
cd "$SRC"

# lower directories : the directories they must not reach
rules=("util comm data io : sync train gpu"
       "train : sync gpu")

# Which directory implements each header: include/ddiloco/[gpu/]X.hpp the one with X.cpp
# (gpu/unit_backend.hpp is src/train's), the rest of include/ddiloco/gpu/ src/gpu; the private
# headers src/D/*.hpp their directory D.
declare -A owner=()
for h in include/ddiloco/gpu/*.hpp; do owner["${h#include/}"]=gpu; done
for h in include/ddiloco/*.hpp include/ddiloco/gpu/*.hpp; do
  for c in src/*/"$(basename "$h" .hpp)".cpp; do
    [[ -e $c && $c != src/cli/* ]] && owner["${h#include/}"]=$(basename "$(dirname "$c")")
  done
done
for h in src/*/*.hpp; do owner["${h#src/}"]=$(basename "$(dirname "$h")"); done
for must in ddiloco/fragments.hpp:sync ddiloco/sync_window.hpp:sync ddiloco/runtime.hpp:sync \
            ddiloco/trainer.hpp:train ddiloco/gpu/unit_backend.hpp:train \
            ddiloco/gpu/host_staging.hpp:gpu ddiloco/wire_format.hpp:comm; do
  [[ ${owner[${must%:*}]:-} == "${must#*:}" ]] ||
    fail "layers.sh places ${must%:*} in src/${owner[${must%:*}]:-?}, expected src/${must#*:}"
done

# Where an #include "..." is found: include/ for ddiloco/..., src/ for the private headers.
resolve() {
  if [[ -e include/$1 ]]; then echo "include/$1"; elif [[ -e src/$1 ]]; then echo "src/$1"; fi
}

bad=0
for rule in "${rules[@]}"; do
  lower=${rule% : *}
  upper=" ${rule#* : } "
  checked=0
  for d in $lower; do
    for f in src/"$d"/*; do
      # Breadth-first over the headers f reaches; via[h] is the file that included h first.
      declare -A via=()
      queue=("$f")
      while ((${#queue[@]})); do
        cur=${queue[0]}
        queue=("${queue[@]:1}")
        while read -r inc; do
          o=${owner[$inc]:-}
          if [[ -n $o && $upper == *" $o "* ]]; then
            chain=$inc
            at=$cur
            while [[ $at != "$f" ]]; do chain="$at -> $chain"; at=${via[$at]}; done
            echo "FAIL: $f -> $chain (src/$o)" >&2
            bad=1
            continue
          fi
          path=$(resolve "$inc")
          [[ -n $path && -z ${via[$path]:-} && $path != "$f" ]] || continue
          via[$path]=$cur
          queue+=("$path")
        done < <(sed -n 's/^#include "\([^"]*\)".*/\1/p' "$cur")
      done
      unset via
      checked=$((checked + 1))
    done
  done
  echo "checked $checked files of src/{${lower// /,}} against the headers of src/{$(echo $upper | tr ' ' ,)}"
done
((bad == 0)) || fail "a lower layer depends on an upper one (chains above)"
echo "PASS: the layers point one way"
