#!/usr/bin/env bash
# Writes tools/demo/.data/kjv.txt: the King James Version of the Bible (1611,
# public domain), one verse per line, as Debian's bible-kjv-text package ships
# it (read with that package's own `bible` program). Needs apt-get (Debian or
# Ubuntu) and network access to the package archive; nothing is installed.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
data="$here/.data"
mkdir -p "$data"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
cd "$work"
apt-get download bible-kjv-text bible-kjv
for f in *.deb; do dpkg-deb -x "$f" root; done
# -f turns pretty-printing off: one line per verse, "Ge1:1 In the beginning ...".
./root/usr/bin/bible -f -d root/usr/lib/bible.data "Gen1:1-Rev22:21" > kjv.refs.txt
# Drop the reference ("Ge1:1 ") in front of each verse.
sed -E 's/^[0-9]?[A-Za-z]+[0-9]+:[0-9]+ //' kjv.refs.txt > "$data/kjv.txt.tmp"
mv "$data/kjv.txt.tmp" "$data/kjv.txt"
cp root/usr/share/doc/bible-kjv-text/copyright "$data/kjv.copyright"
wc -l "$data/kjv.txt"
sha256sum "$data/kjv.txt"
