#!/usr/bin/env bash
# experiments/gpu-check's profile step: Nsight Compute over
# `spbench-gpu-check --profile`, clocks left alone, the report exported as
# two CSVs and then deleted; no ncu (SPB_GPU_CHECK_NCU=none) is one log line.
# With stand-in programs and a stand-in ncu that records its arguments and
# runs the program it is given, so no GPU is needed.
# Usage: gpu_check_profile.sh SOURCE_DIR
set -u
root=$1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/build"
echo "SPB_CUDA_EMU:BOOL=ON" > "$tmp/build/CMakeCache.txt"
cat > "$tmp/build/spbench-gpu-check" <<'STUB'
#!/usr/bin/env bash
echo "program:$*" >> "$CALLS"
case " $* " in *" --profile "*) echo "profile call 1: flash fwd (mma) N=64 causal"; exit 0 ;; esac
out=.
while [ $# -gt 0 ]; do case "$1" in --out) out=$2; shift 2 ;; *) shift ;; esac; done
mkdir -p "$out" && echo "kernel,result" > "$out/checks.csv"
STUB
for p in spbench-gpu-layer spbench spbench-dump-compare; do printf '#!/bin/sh\nexit 0\n' > "$tmp/build/$p"; done
cat > "$tmp/ncu" <<'STUB'
#!/usr/bin/env bash
echo "ncu:$*" >> "$CALLS"
if [ "$1" = --import ]; then
    case "$*" in *"--page raw"*) echo '"ID","Kernel Name","raw metric"' ;; *) echo '"ID","Kernel Name","Section Name"' ;; esac
    exit 0
fi
rep="" prog=()
while [ $# -gt 0 ]; do
    case "$1" in
    -o) rep=$2; shift 2 ;;
    --clock-control|-k|--section) shift 2 ;;
    -f) shift ;;
    *) prog=("$@"); break ;;
    esac
done
"${prog[@]}" || exit $?
[ -n "$rep" ] && echo report > "$rep.ncu-rep"
STUB
chmod +x "$tmp/build/"* "$tmp/ncu"
export CALLS="$tmp/calls.txt"
passed=0 failed=0
verdict() { # label, status
    if [ "$2" = 0 ]; then echo "ok   $1"; passed=$((passed + 1)); else echo "FAIL $1"; failed=$((failed + 1)); fi
}
run() { # out, SPB_GPU_CHECK_NCU
    SPB_GPU_CHECK_EMULATE=1 SPB_GPU_CHECK_PREBUILT=1 SPB_GPU_CHECK_BUILD="$tmp/build" SPB_GPU_CHECK_NCU="$2" \
        "$root/experiments/gpu-check" --out "$1" --skip strategies,core-step,torch > "$1.log" 2>&1
}
run "$tmp/out" "$tmp/ncu"
verdict "the script passes (rc=$?)" $?
verdict "ncu leaves the clocks alone and names the kernels" \
    $(grep -q "^ncu:--clock-control none .*-k regex:" "$CALLS" && echo 0 || echo 1)
# the kernel filter takes every attention kernel of cuda_attention.cu and its
# per-family parts (the wgmma probe aside): a kernel it misses would be left
# out of the profile
filter=$(grep -m1 "^ncu:--clock-control" "$CALLS" | sed -n 's/.* -k regex:\([^ ]*\) .*/\1/p')
kernels=$(grep -hoP '^__global__ void (__launch_bounds__\([^)]*\) )?\K[a-z_]+(?=\(spb_attn_desc)' \
    "$root"/common/cuda/cuda_attention.cu "$root"/common/cuda/cuda_attention_*.cuh | sort -u)
missed=$(for k in $kernels; do grep -Eq "$filter" <<<"$k" || echo "$k"; done)
verdict "the kernel filter ($filter) takes all $(wc -w <<<"$kernels") attention kernels${missed:+ (missed: $(echo $missed))}" \
    $([ -n "$filter" ] && [ "$(wc -w <<<"$kernels")" -ge 12 ] && [ -z "$missed" ] && echo 0 || echo 1)
verdict "the program runs under ncu with --profile at the smoke shape" \
    $(grep -q "^program:--profile --tokens 64 --smoke" "$CALLS" && echo 0 || echo 1)
verdict "the report exported: details and raw CSVs" \
    $([ -s "$tmp/out/ncu_attention.csv" ] && grep -q "raw metric" "$tmp/out/ncu_attention_raw.csv" && echo 0 || echo 1)
verdict "the calls' order kept in ncu_attention.log" $(grep -q "profile call 1" "$tmp/out/ncu_attention.log" && echo 0 || echo 1)
verdict "the binary report deleted" $([ ! -e "$tmp/out/ncu_attention.ncu-rep" ] && echo 0 || echo 1)
# in section 3, after the correctness checks (section 1) and the core step (section 2): a lease's
# deadline cuts the diagnostics, not the checks never run on a GPU
verdict "the profile runs after the strategy runs and the core step" \
    $(awk '/profile: .*ncu_attention.csv/ { p = NR } /strategies: skipped/ { s = NR } /core-step: skipped/ { c = NR }
        END { exit !(p && s && c && p > s && p > c) }' "$tmp/out.log" && echo 0 || echo 1)
verdict "the log names the CSVs" $(grep -q "profile: .*ncu_attention.csv" "$tmp/out.log" && echo 0 || echo 1)
: > "$CALLS"
run "$tmp/none" none
verdict "SPB_GPU_CHECK_NCU=none: the script passes (rc=$?)" $?
verdict "... and says the profile was skipped" $(grep -q "profile: no Nsight Compute (ncu) found: skipped" "$tmp/none.log" && echo 0 || echo 1)
verdict "... and never ran ncu" $(grep -q "^ncu:" "$CALLS" && echo 1 || echo 0)
[ "$failed" = 0 ] || { echo "--- gpu-check's output:"; cat "$tmp/out.log"; }
echo "$passed passed, $failed failed"
[ "$failed" = 0 ]
