#!/bin/sh
# Part of `make setup`: store optrace's BPF programs for this kernel, each kind loaded once by the command
# that loads it with its default options, so that no run compiles before its first sample (what
# `optrace doctor` calls warm; bpf/programcache.py). Programs already stored load in a few hundredths of
# a second, so a second run is quick. Root's cache: /var/cache/optrace/programs.
set -eu

OPTRACE="${OPTRACE:-.venv/bin/optrace}"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT

"$OPTRACE" record -o "$tmp/r" -- true 2>/dev/null                             # record -p, -- CMD, top -p
"$OPTRACE" record --off-cpu -o "$tmp/r" -- true 2>/dev/null                   # --off-cpu
"$OPTRACE" record --off-cpu --wakers -o "$tmp/r" -- true 2>/dev/null          # --off-cpu --wakers
"$OPTRACE" record -a -d 0.1 -o "$tmp/r" 2>/dev/null                           # record -a, top
"$OPTRACE" count -d 0.1 c:getpid >/dev/null 2>&1                              # count, --uprobe
"$OPTRACE" serve --listen 127.0.0.1:0 2>"$tmp/serve.log" &                    # serve (build-id stacks)
serve=$!
for _ in $(seq 1200); do
    grep -q "serving" "$tmp/serve.log" 2>/dev/null && break
    kill -0 "$serve" 2>/dev/null || break
    sleep 0.1
done
kill -INT "$serve" 2>/dev/null || true
wait "$serve" 2>/dev/null || true
"$OPTRACE" doctor | grep "BPF programs" || true
