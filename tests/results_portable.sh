#!/usr/bin/env bash
# Committed results name no directory of the machine that made them: no file
# under results/ holds an absolute path of the form /work/, /root/, /home/ or
# /tmp/ (the runner writes paths inside the repository relative to it:
# experiments/sweeplib.py's portable()).  Usage: results_portable.sh REPO_ROOT
set -euo pipefail
root=${1:?usage: results_portable.sh REPO_ROOT}
[ -d "$root/results" ] || { echo "results_portable: $root/results is not a directory" >&2; exit 1; }
# -I: text files only (the PNGs are binary); the paths as they appear, file:line
if hits=$(grep -rnIE '(^|[^A-Za-z0-9_.~-])/(work|root|home|tmp)/' "$root/results"); then
    echo "results_portable: absolute paths of a machine in committed results:" >&2
    echo "$hits" | cut -c1-300 | head -n 20 >&2
    echo "($(echo "$hits" | wc -l) lines; write paths relative to the repository)" >&2
    exit 1
fi
echo "results_portable: no absolute machine paths under results/ ($(find "$root/results" -type f | wc -l) files)"
