#!/usr/bin/env bash
# experiments/gpu-check when spbench-gpu-check dies (a kernel fault ends its
# CUDA context) or hangs (its watchdog ends it): the script must run it once
# more with --no-wgmma, keep the first run's CSVs as died-run-*, go on, and
# still exit non-zero.  With stand-in programs (SPB_GPU_CHECK_PREBUILT), so
# no GPU or emulation build is needed: the first call dies as a fault would
# (exit 3) or as the watchdog ends it (exit 5), the second, with
# --no-wgmma, passes.  And --part K/N goes to spbench-gpu-check, both runs,
# and to no other program.  Usage: gpu_check_retry.sh SOURCE_DIR
set -u
root=$1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/build"
echo "SPB_CUDA_EMU:BOOL=ON" > "$tmp/build/CMakeCache.txt"
cat > "$tmp/build/spbench-gpu-check" <<'STUB'
#!/usr/bin/env bash
out=.
while [ $# -gt 0 ]; do
    case "$1" in --out) out=$2; shift 2 ;; *) args="${args:-} $1"; shift ;; esac
done
mkdir -p "$out"
echo "call:${args:-}" >> "$out/../calls.txt"
case "${args:-}" in
*--no-wgmma*) echo "kernel,result" > "$out/checks.csv"; echo "gemm,PASS" >> "$out/checks.csv"; exit 0 ;;
*) echo "kernel,result" > "$out/checks.csv"; echo "flash wgmma,?" >> "$out/checks.csv"
   if [ "${STUB_DEATH:-3}" = 5 ]; then
       echo "spbench-gpu-check: watchdog: no progress for 60 s (--watchdog 60) after ...: exiting with code 5" >&2
   else
       echo "spbench: CUDA call failed: an illegal memory access was encountered" >&2
   fi
   exit "${STUB_DEATH:-3}" ;;
esac
STUB
cat > "$tmp/build/spbench-gpu-layer" <<'STUB'
#!/usr/bin/env bash
echo "layer:$*" >> "$(dirname "$0")/../layer_calls.txt"
case " $* " in *" --part "*) echo "spbench-gpu-layer: unknown argument --part" >&2; exit 2 ;; esac
exit 0
STUB
chmod +x "$tmp/build/spbench-gpu-check" "$tmp/build/spbench-gpu-layer"

passed=0 failed=0
verdict() { # label, status
    if [ "$2" = 0 ]; then echo "ok   $1"; passed=$((passed + 1)); else echo "FAIL $1"; failed=$((failed + 1)); fi
}
for death in 3 5; do # a fault, then the watchdog
    rm -rf "$tmp/out" "$tmp/calls.txt" "$tmp/layer_calls.txt"
    STUB_DEATH=$death SPB_GPU_CHECK_EMULATE=1 SPB_GPU_CHECK_PREBUILT=1 SPB_GPU_CHECK_BUILD="$tmp/build" \
        "$root/experiments/gpu-check" --out "$tmp/out" --check-only --skip strategies --part 2/3 > "$tmp/log" 2>&1
    rc=$?
    verdict "exit $death: the script exits non-zero after it (rc=$rc)" $([ "$rc" != 0 ] && echo 0 || echo 1)
    verdict "a second run, with --no-wgmma" \
        $(grep -q "call:.*--no-wgmma" "$tmp/calls.txt" && [ "$(wc -l < "$tmp/calls.txt")" = 2 ] && echo 0 || echo 1)
    verdict "the log says why" $(grep -q "died (exit $death): again with --no-wgmma" "$tmp/log" && echo 0 || echo 1)
    if [ "$death" = 5 ]; then
        verdict "the log names the watchdog" $(grep -q "stopped by its watchdog" "$tmp/log" && echo 0 || echo 1)
    fi
    verdict "the first run's CSV kept as died-run-checks.csv" \
        $(grep -q "flash wgmma" "$tmp/out/died-run-checks.csv" 2>/dev/null && echo 0 || echo 1)
    verdict "--part 2/3 given to both runs of spbench-gpu-check" \
        $([ "$(grep -c 'call:.*--part 2/3' "$tmp/calls.txt")" = 2 ] && echo 0 || echo 1)
    verdict "spbench-gpu-layer ran, without --part" \
        $(grep -q "^layer:" "$tmp/layer_calls.txt" 2>/dev/null && ! grep -q -- "--part" "$tmp/layer_calls.txt" &&
          echo 0 || echo 1)
    verdict "the second run's CSV in its place" \
        $(grep -q "gemm,PASS" "$tmp/out/checks.csv" 2>/dev/null && echo 0 || echo 1)
    [ "$failed" = 0 ] || { echo "--- gpu-check's output (exit $death):"; cat "$tmp/log"; break; }
done
echo "$passed passed, $failed failed"
[ "$failed" = 0 ]
