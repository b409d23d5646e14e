# docs/config.md is the table `ddiloco config --list --markdown` prints: a key added or changed
# in the parser without regenerating the page fails here.
source "$(dirname "$0")/lib/common.sh"
cd "$WORK"
"$DDILOCO" config --list --markdown > config.md
if ! diff -u "$SRC/docs/config.md" config.md; then
  echo "FAIL: docs/config.md is out of date; regenerate it with:"
  echo "  build/ddiloco config --list --markdown > docs/config.md"
  exit 1
fi
echo "PASS: docs/config.md matches the parser's keys"
