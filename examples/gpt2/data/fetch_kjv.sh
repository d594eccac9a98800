#!/usr/bin/env bash
# fetch_kjv.sh — rebuilds kjv.txt.xz (the King James Version, public domain) from Debian's
# packages bible-kjv-text (the compressed text) and bible-kjv (the `bible` program that reads it).
# Nothing is installed: both .deb files are unpacked into a temporary folder.
#
#   bash examples/gpt2/data/fetch_kjv.sh            # writes examples/gpt2/data/kjv.txt.xz
#   bash examples/gpt2/data/fetch_kjv.sh --check    # only compares with the shipped file's text
#
# Output format: one chapter after another, "Book N" heading, a blank line, one verse a line
# ("1 In the beginning God created the heaven and the earth."), a blank line between chapters;
# ASCII, LF line ends. The `bible` program's own output with the leading indentation of the verse
# lines, trailing spaces and the first empty line removed (see data/README.md for the sha256).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
cd "$tmp"
apt-get download bible-kjv-text bible-kjv >/dev/null
for d in *.deb; do dpkg-deb -x "$d" root; done
ls -1 *.deb
# -l100000: no line wrapping (one verse a line); -p: the unpacked data file
root/usr/bin/bible -p root/usr/lib -l100000 "Gen1:1-Rev22:21" \
  | sed -e 's/^ *//' -e 's/ *$//' | sed -e '1{/^$/d}' > kjv.txt
echo "kjv.txt: $(wc -c < kjv.txt) bytes, sha256 $(sha256sum kjv.txt | cut -d' ' -f1)"
if [ "${1:-}" = "--check" ]; then
  xz -dc "$here/kjv.txt.xz" | cmp - kjv.txt && echo "same text as the shipped kjv.txt.xz"
else
  xz -9e -T1 -c kjv.txt > "$here/kjv.txt.xz"
  echo "wrote $here/kjv.txt.xz ($(wc -c < "$here/kjv.txt.xz") bytes)"
fi
