#!/usr/bin/env bash
# spbrun when ranks fail: every scenario must end the whole job within
# seconds (no rank left waiting) with the status the launcher promises.
#   a rank killed by SIGKILL mid-collective (itself, and from outside)  128+9
#   MPI_Abort(5) while the others wait                                  5
#   all ranks finalize and exit 2 (spbench's bad-input path)            2
#   one rank exits 3 while the others wait in a barrier                 3
#   a rank exits 0 without MPI_Finalize                                 non-zero
#   mismatched collectives: one "file:line:" error, no hang             non-zero
#   a program that cannot be run                                        127
#   spbrun itself stopped by SIGTERM: no rank survives                  128+15
#   mpiexec-style options accepted, -x VAR=VALUE reaches the ranks       0
# Usage: shm_mpi_failures.sh SPBRUN TEST_SHM_MPI
set -u
spbrun=$1
prog=$2
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
passed=0
failed=0

verdict() { # name, ok (0/1), detail
  if [ "$2" -eq 0 ]; then passed=$((passed + 1)); echo "ok   $1: $3"; else failed=$((failed + 1)); echo "FAIL $1: $3"; sed 's/^/     | /' "$tmp/err" | head -20; fi
}

# name, wanted status ("nz": any non-zero), max seconds, spbrun arguments...
scenario() {
  local name=$1 want=$2 limit=$3; shift 3
  local start=$SECONDS
  timeout 60 "$spbrun" "$@" > "$tmp/out" 2> "$tmp/err"
  local rc=$? took=$((SECONDS - start)) ok=1
  if [ "$want" = nz ]; then [ "$rc" -ne 0 ] && [ "$rc" -ne 124 ] && ok=0; else [ "$rc" -eq "$want" ] && ok=0; fi
  [ "$took" -le "$limit" ] || ok=1
  verdict "$name" "$ok" "rc=$rc (want $want) after ${took}s (limit ${limit}s)"
}

for np in 2 4; do
  scenario "np$np rank 1 SIGKILLs itself mid-collective" 137 10 -np $np "$prog" --fail kill
  scenario "np$np MPI_Abort(5) while the others wait" 5 10 -np $np "$prog" --fail abort
  scenario "np$np every rank finalizes and exits 2" 2 10 -np $np "$prog" --fail exit2
  scenario "np$np rank 1 exits 3, the others wait" 3 10 -np $np "$prog" --fail exit3-one
  scenario "np$np rank 1 exits 0 without MPI_Finalize" nz 10 -np $np "$prog" --fail no-finalize
done

scenario "mismatched collectives" nz 10 -np 2 "$prog" --fail mismatch
lines=$(grep -c '^shm MPI: rank [0-9]*: .*shm_collectives\.c:[0-9]*: MPI_Allreduce' "$tmp/err")
[ "$lines" -ge 1 ]
verdict "mismatched collectives: a file:line message" $? "$(grep -m1 '^shm MPI' "$tmp/err")"

scenario "program not found" 127 10 -np 2 /nonexistent/program
scenario "options as Open MPI's mpiexec takes them" 0 20 --oversubscribe --allow-run-as-root --bind-to none \
  --mca btl self -x SHM_TEST_FOO=bar -n 2 "$prog" --fail env
scenario "no -np" 2 5 "$prog"

# A rank killed from outside at a random point of its collectives.
export SHM_TEST_PIDDIR=$tmp
"$spbrun" -np 4 "$prog" --fail spin > "$tmp/out" 2> "$tmp/err" &
launcher=$!
for _ in $(seq 1 100); do [ -s "$tmp/rank2.pid" ] && break; sleep 0.1; done
sleep 0.5
victim=$(cat "$tmp/rank2.pid" 2>/dev/null || true)
start=$SECONDS
[ -n "$victim" ] && kill -9 "$victim"
for _ in $(seq 1 150); do kill -0 "$launcher" 2>/dev/null || break; sleep 0.1; done
if kill -0 "$launcher" 2>/dev/null; then
  kill -9 "$launcher"
  verdict "rank 2 killed from outside" 1 "spbrun still running 15 s later"
else
  wait "$launcher"; rc=$?
  [ -n "$victim" ] && [ "$rc" -eq 137 ]
  verdict "rank 2 killed from outside" $? "rc=$rc after $((SECONDS - start))s"
fi

# spbrun stopped by SIGTERM: it stops its ranks, none survives it.
rm -f "$tmp"/rank*.pid
"$spbrun" -np 4 "$prog" --fail spin > "$tmp/out" 2> "$tmp/err" &
launcher=$!
for _ in $(seq 1 100); do [ "$(ls "$tmp"/rank*.pid 2>/dev/null | wc -l)" -eq 4 ] && break; sleep 0.1; done
sleep 0.3
kill -TERM "$launcher"
wait "$launcher"; rc=$?
sleep 0.5
left=0
for f in "$tmp"/rank*.pid; do kill -0 "$(cat "$f")" 2>/dev/null && left=$((left + 1)); done
[ "$rc" -eq 143 ] && [ "$left" -eq 0 ]
verdict "spbrun stopped by SIGTERM" $? "rc=$rc, $left ranks left running"

echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
