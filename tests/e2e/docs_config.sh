# docs/config.md and docs/sim_config.md are the tables `ddiloco config --list --markdown` and
# `ddiloco simulate --list --markdown` print: a key added or changed in a parser without
# regenerating its page fails here.
source "$(dirname "$0")/lib/common.sh"
cd "$WORK"
check() {
  local page=$1; shift
  "$DDILOCO" "$@" --list --markdown > page.md
  if ! diff -u "$SRC/docs/$page" page.md; then
    echo "FAIL: docs/$page is out of date; regenerate it with:"
    echo "  build/ddiloco $* --list --markdown > docs/$page"
    exit 1
  fi
  echo "PASS: docs/$page matches the parser's keys"
}
check config.md config
check sim_config.md simulate
