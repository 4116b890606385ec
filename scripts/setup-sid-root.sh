#!/bin/sh
# The Debian sid root the Python tests run CPython 3.14 and 3.15 from (tests/python/pythons.py): sid's
# python3.14/python3.15 need sid's glibc, so they run in a root of their own, as a container runs them. Made
# once with debootstrap from the Debian archive apt is configured with, then kept (about 80 s and 360 MB;
# a second run checks and returns in well under a second). OPTRACE_SID_ROOT moves it.
# The -dev packages hold each version's headers: scripts/python_layouts.py reads the walker's tables from
# them and tests/python checks the tables against them.
set -eu

ROOT="${OPTRACE_SID_ROOT:-/var/cache/optrace-test/sid}"
PACKAGES="python3.14,python3.15,libpython3.14-dev,libpython3.15-dev"
STAMP="$ROOT/.optrace-root"

if [ -e "$STAMP" ] && [ "$(cat "$STAMP")" = "$PACKAGES" ]; then
    exit 0
fi
command -v debootstrap >/dev/null || {
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends debootstrap >/dev/null
}
mirror="$(sed -n 's/^URIs: *//p' /etc/apt/sources.list.d/debian.sources 2>/dev/null | head -n1)"
[ -n "$mirror" ] || mirror="$(awk '$1 == "deb" {print $2; exit}' /etc/apt/sources.list 2>/dev/null)"
[ -n "$mirror" ] || mirror="http://deb.debian.org/debian"
echo "setup: making the sid root for python3.14/3.15 at $ROOT from $mirror (about 80 s)"
started=$(date +%s)
rm -rf "$ROOT.new"
mkdir -p "$(dirname "$ROOT")"
debootstrap --variant=minbase --include="$PACKAGES" sid "$ROOT.new" "$mirror" >"$ROOT.log" 2>&1 || {
    echo "setup: debootstrap failed, see $ROOT.log" >&2
    exit 1
}
echo "$PACKAGES" >"$ROOT.new/.optrace-root"
rm -rf "$ROOT"
mv "$ROOT.new" "$ROOT"
echo "setup: sid root ready in $(( $(date +%s) - started )) s ($(du -sh "$ROOT" | cut -f1))"
