#!/bin/sh
# System part of `make setup`: Debian packages, kernel headers visible to BCC, tracefs.
# chromium: the tests look at the flame graph pages in headless Chromium (tests/browser.py).
# Idempotent: every step checks before it acts, so a second run takes about a second.
set -eu

PACKAGES="python3-bpfcc bpfcc-tools bpftrace python3-venv bpftool linux-perf prometheus gcc g++ make binutils elfutils xz-utils openssl time util-linux chromium golang-go tmux sqlite3"
KREL="$(uname -r)"

need_install=""
for p in $PACKAGES; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || need_install="$need_install $p"
done
# Kernel headers: the exact package where Debian has one, else the distribution's meta package.
if [ ! -e "/lib/modules/$KREL/build/include" ]; then
    if apt-cache show "linux-headers-$KREL" >/dev/null 2>&1; then
        need_install="$need_install linux-headers-$KREL"
    else
        dpkg-query -W -f='${Status}' linux-headers-amd64 2>/dev/null | grep -q "install ok installed" \
            || need_install="$need_install linux-headers-amd64"
    fi
fi
if [ -n "$need_install" ]; then
    echo "setup: installing$need_install"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $need_install >/dev/null
fi

# BCC looks for headers in /lib/modules/$(uname -r)/{build,source}. Debian splits its tree into
# linux-headers-<ver>-amd64 (build) and linux-headers-<ver>-common (source): link both.
if [ ! -e "/lib/modules/$KREL/build/include" ]; then
    build="$(ls -d /usr/src/linux-headers-*-amd64 2>/dev/null | sort -V | tail -n1)"
    common="$(ls -d /usr/src/linux-headers-*-common 2>/dev/null | sort -V | tail -n1)"
    if [ -z "$build" ] || [ -z "$common" ]; then
        echo "setup: no kernel headers found under /usr/src; install linux-headers-amd64" >&2
        exit 1
    fi
    mkdir -p "/lib/modules/$KREL"
    ln -sfn "$build" "/lib/modules/$KREL/build"
    ln -sfn "$common" "/lib/modules/$KREL/source"
    echo "setup: kernel headers for BCC: $build (+ $common)"
fi

# Without tracefs BCC cannot detach uprobes at exit.
if [ ! -e /sys/kernel/tracing/uprobe_events ]; then
    mount -t tracefs nodev /sys/kernel/tracing
    echo "setup: mounted tracefs at /sys/kernel/tracing"
fi
