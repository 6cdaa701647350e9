#!/usr/bin/env bash
# The GPU check programs' watchdog (experiments/gpu_watchdog.h) on the
# emulated device, whose kernels run on the CPU and so are slow enough to
# stand in for one that never finishes: with --watchdog 0.5, a unit whose
# checks take longer ends the process within seconds with exit 5 and one line naming
# what came last, while the main thread is still inside the kernels; the
# rows written before it stay whole in the CSV.  Without --watchdog the
# emulated device runs with none (its units can take minutes), and a bad
# value is a usage error.  Usage: gpu_watchdog.sh BUILD_DIR
set -u
build=$1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
passed=0 failed=0
verdict() { # label, status
    if [ "$2" = 0 ]; then echo "ok   $1"; passed=$((passed + 1)); else echo "FAIL $1"; failed=$((failed + 1)); fi
}
# one unit of attention checks (the wgmma backward with dQ fused, fp16,
# head dim 128): 3-10 s on the emulator, 3 checks, over a second between
# them on an idle 2-core machine (2 s was too close: an idle race-check
# build once finished the unit without a gap that long); unit 215 of the
# 279 since the Llama kernels' checks came in before it (it was 200/264)
unit=(--check-only --part 215/279 --lean-fp16)

start=$SECONDS
timeout 120 "$build/spbench-gpu-check" "${unit[@]}" --out "$tmp/a" --watchdog 0.5 >"$tmp/a.out" 2>"$tmp/a.err"
rc=$? took=$((SECONDS - start))
verdict "spbench-gpu-check --watchdog 0.5: exit 5 (rc=$rc) within 8 s (${took} s)" \
    $([ "$rc" = 5 ] && [ "$took" -lt 8 ] && echo 0 || echo 1)
line='^spbench-gpu-check: watchdog: no progress for [0-9.]* s (--watchdog 0.5) after the '
verdict "one line names the watchdog and what came last" \
    $([ "$(grep -c "$line" "$tmp/a.err")" = 1 ] && echo 0 || echo 1)
verdict "checks.csv: its header and whole rows only" \
    $(head -1 "$tmp/a/checks.csv" 2>/dev/null | grep -q '^gpu,driver,' &&
      awk -F, 'NR > 1 && NF < 10 { bad = 1 } END { exit bad }' "$tmp/a/checks.csv" && echo 0 || echo 1)
[ "$rc" = 5 ] || { tail -3 "$tmp/a.out"; cat "$tmp/a.err"; }

timeout 120 "$build/spbench-gpu-layer" --check-only --watchdog 1 >"$tmp/l.out" 2>"$tmp/l.err"
rc=$?
# (after its last check, or after its start where the first check alone takes a second: a slower build)
verdict "spbench-gpu-layer --watchdog 1: exit 5 (rc=$rc) and its line" \
    $([ "$rc" = 5 ] && grep -q "^spbench-gpu-layer: watchdog: no progress for [0-9.]* s (--watchdog 1) after the " \
      "$tmp/l.err" && echo 0 || echo 1)

timeout 300 "$build/spbench-gpu-check" "${unit[@]}" --out "$tmp/b" >"$tmp/b.out" 2>"$tmp/b.err"
rc=$?
verdict "no --watchdog on the emulated device: the unit runs to the end (rc=$rc, 3 rows)" \
    $([ "$rc" = 0 ] && [ "$(($(wc -l < "$tmp/b/checks.csv") - 1))" = 3 ] && ! grep -q watchdog "$tmp/b.err" &&
      echo 0 || echo 1)

"$build/spbench-gpu-check" --watchdog soon >/dev/null 2>&1
rc=$?
verdict "--watchdog soon: usage error (rc=$rc)" $([ "$rc" = 2 ] && echo 0 || echo 1)

echo "$passed passed, $failed failed"
[ "$failed" = 0 ]
