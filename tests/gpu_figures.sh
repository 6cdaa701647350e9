#!/usr/bin/env bash
# plots/gpu-figures on the committed results/gpu CSVs: both PNGs made (PNG
# magic, more than a few KB), into --outdir; without torch_timings.csv still
# both, without the torch series; a missing timings.csv or layer_timings.csv,
# or a failing gnuplot, gives a non-zero exit with a message and no figure.
# Skips (77) only when gnuplot is absent.  Usage: gpu_figures.sh SOURCE_DIR
set -u
root=$1
command -v gnuplot > /dev/null || { echo "gnuplot not found: skipped"; exit 77; }
fig=$root/plots/gpu-figures
src=$root/results/gpu
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
passed=0 failed=0
verdict() { # label, status
    if [ "$2" = 0 ]; then echo "ok   $1"; passed=$((passed + 1)); else echo "FAIL $1"; failed=$((failed + 1)); fi
}
is_png() { # file, minimum bytes
    [ -f "$1" ] && [ "$(head -c 8 "$1" | od -An -tx1 | tr -d ' \n')" = 89504e470d0a1a0a ] &&
        [ "$(wc -c < "$1")" -gt "$2" ]
}
yes() { "$@" && echo 0 || echo 1; }

"$fig" --dir "$src" --outdir "$tmp/out" > "$tmp/log" 2>&1
rc=$?
verdict "runs on results/gpu (rc=$rc)" $([ "$rc" = 0 ] && echo 0 || echo 1)
for f in gpu-attention.png gpu-layer.png; do
    verdict "$f is a PNG over 20 KB ($(wc -c < "$tmp/out/$f" 2>/dev/null || echo no file) bytes)" \
        $(yes is_png "$tmp/out/$f" 20000)
done
verdict "attention series: ours mma and wgmma, cuDNN, torch SDPA default and flash" \
    $(yes grep -q "mma kernel; ours: flash attention, wgmma kernel; ours: cuDNN through our binding; torch SDPA, default backend; torch SDPA, flash backend" "$tmp/log")
verdict "layer series: P=1, the three strategies at P=8, torch" \
    $(yes grep -q "ring, busiest rank (contiguous) at P=8, no comm.; torch eager: whole layer" "$tmp/log")

# a layer_timings.csv with layer-cudnn rows (here the layer's own, relabelled:
# a fixture for the series, not a figure) gets the cuDNN-attention series
mkdir -p "$tmp/cudnn"
cp "$src/timings.csv" "$src/torch_timings.csv" "$tmp/cudnn/"
{ cat "$src/layer_timings.csv"; grep ',layer,fwd+bwd,' "$src/layer_timings.csv" | sed 's/,layer,fwd+bwd,/,layer-cudnn,fwd+bwd,/'; } \
    > "$tmp/cudnn/layer_timings.csv"
"$fig" --dir "$tmp/cudnn" > "$tmp/log-cudnn" 2>&1
rc=$?
verdict "layer-cudnn rows: the cuDNN-attention layer series drawn (rc=$rc)" \
    $([ "$rc" = 0 ] && grep -q "no comm.; ours with cuDNN attention: whole layer (P=1); torch eager" "$tmp/log-cudnn" &&
      is_png "$tmp/cudnn/gpu-layer.png" 20000 && echo 0 || echo 1)
verdict "no layer-cudnn rows, no such series" $(grep -q "cuDNN attention: whole layer" "$tmp/log" && echo 1 || echo 0)

mkdir -p "$tmp/notorch"
cp "$src/timings.csv" "$src/layer_timings.csv" "$tmp/notorch/"
"$fig" --dir "$tmp/notorch" > "$tmp/log-notorch" 2>&1
rc=$?
verdict "without torch_timings.csv: rc 0, a note, both PNGs, no torch series (rc=$rc)" \
    $([ "$rc" = 0 ] && grep -q "no torch_timings.csv" "$tmp/log-notorch" && ! grep -q "torch SDPA\|torch eager" "$tmp/log-notorch" &&
      is_png "$tmp/notorch/gpu-attention.png" 20000 && is_png "$tmp/notorch/gpu-layer.png" 20000 && echo 0 || echo 1)

for missing in timings.csv layer_timings.csv; do
    d=$tmp/no-${missing%.csv}
    mkdir -p "$d"
    for f in timings.csv layer_timings.csv torch_timings.csv; do [ "$f" = "$missing" ] || cp "$src/$f" "$d/"; done
    "$fig" --dir "$d" > "$d.log" 2>&1
    rc=$?
    verdict "without $missing: non-zero exit, one message naming it, no PNG (rc=$rc)" \
        $([ "$rc" != 0 ] && grep -q "error: .*missing $missing" "$d.log" && [ "$(wc -l < "$d.log")" = 1 ] &&
          ! ls "$d"/*.png > /dev/null 2>&1 && echo 0 || echo 1)
done

mkdir -p "$tmp/bin"
printf '#!/bin/sh\necho "stand-in gnuplot: failing" >&2\nexit 1\n' > "$tmp/bin/gnuplot"
chmod +x "$tmp/bin/gnuplot"
PATH="$tmp/bin:$PATH" "$fig" --dir "$src" --outdir "$tmp/badgp" > "$tmp/log-badgp" 2>&1
rc=$?
verdict "a failing gnuplot: non-zero exit, its message passed on (rc=$rc)" \
    $([ "$rc" != 0 ] && grep -q "gnuplot gpu-attention.gp .* failed" "$tmp/log-badgp" &&
      grep -q "stand-in gnuplot: failing" "$tmp/log-badgp" && echo 0 || echo 1)

if [ "$failed" != 0 ]; then
    for l in "$tmp"/log*; do echo "--- $l:"; cat "$l"; done
fi
echo "$passed passed, $failed failed"
[ "$failed" = 0 ]
