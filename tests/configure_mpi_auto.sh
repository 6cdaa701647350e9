#!/usr/bin/env bash
# SPB_MPI=AUTO on a machine without a system MPI must configure with the
# built-in shm MPI and build spbench on it (docs/BUILD.md).  FindMPI's failed
# search leaves an empty MPI::MPI_C target behind, which once stopped the
# configure.  Where an MPI is installed, FindMPI is told not to look for its
# compiler wrapper nor guess its libraries, and pkg-config finds no .pc
# files (openmpi ships mpi-c.pc); if it finds one anyway the test cannot
# tell and reports itself skipped (77).
#   configure_mpi_auto.sh SOURCE_DIR
set -uo pipefail
src=${1:?usage: configure_mpi_auto.sh SOURCE_DIR}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/no-pkgconfig"
if ! PKG_CONFIG_LIBDIR="$tmp/no-pkgconfig" PKG_CONFIG_PATH="" \
    cmake -S "$src" -B "$tmp/build" -DSPB_MPI=AUTO -DSPB_CUDA=OFF -DSPB_BLAS=FALLBACK -DSPB_WITH_CHECK=OFF \
    -DBUILD_TESTING=OFF -DMPI_SKIP_COMPILER_WRAPPER=TRUE -DMPI_SKIP_GUESSING=TRUE >"$tmp/configure.log" 2>&1; then
    echo "FAIL: SPB_MPI=AUTO without an MPI does not configure:"
    grep -A6 'CMake Error' "$tmp/configure.log" | head -20
    exit 1
fi
if grep -q 'spbench MPI: system MPI' "$tmp/configure.log"; then
    echo "skipped: FindMPI found this machine's MPI even so"
    exit 77
fi
grep -q 'spbench MPI: built-in shm MPI.*(SPB_MPI=AUTO)' "$tmp/configure.log" ||
    { echo "FAIL: the configure does not say it took the shm MPI"; cat "$tmp/configure.log"; exit 1; }
# the programs link the shm MPI through MPI::MPI_C: two ranks under spbrun
cmake --build "$tmp/build" -j2 --target spbench spbrun >"$tmp/build.log" 2>&1 ||
    { echo "FAIL: spbench does not build on the shm MPI"; tail -20 "$tmp/build.log"; exit 1; }
out=$("$tmp/build/spbrun" -np 2 "$tmp/build/spbench" --strategy ulysses --sp-degree 2 --num-layers 1 \
    --hidden-size 32 --num-attention-heads 4 --seq-length 16 --train-iters 2 2>&1) ||
    { echo "FAIL: spbench on 2 shm ranks: $out"; exit 1; }
echo "$out" | tail -3
echo "PASS: SPB_MPI=AUTO without an MPI configures, builds and runs on the shm MPI"
