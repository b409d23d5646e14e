# Every relative link in README.md and docs/ names a file that exists and, with an #anchor, a
# heading that is in it (scripts/check_links.py): a page moved or a heading renamed without its
# links fails here.
source "$(dirname "$0")/lib/common.sh"
/usr/bin/python3 "$SRC/scripts/check_links.py" "$SRC" || fail "broken links in the docs (above)"
# The checker itself finds a broken file link and a broken anchor.
mkdir -p "$WORK/t/docs" && cd "$WORK/t" && git init -q .
printf '# T\n\n## A heading, here\n\n[ok](#a-heading-here) [gone](docs/none.md) [bad](#nowhere)\n' > README.md
if out=$(/usr/bin/python3 "$SRC/scripts/check_links.py" "$WORK/t"); then fail "a broken link passed: $out"; fi
grep -q "no such file docs/none.md" <<<"$out" || fail "the missing file was not named: $out"
grep -q "no heading '#nowhere'" <<<"$out" || fail "the missing anchor was not named: $out"
grep -q "a-heading-here" <<<"$out" && fail "a good anchor was refused: $out"
echo "docs_links: passed"
