#!/usr/bin/env bash
# MPI under a real launcher (mpirun -np 2 on this machine): tests/dist_check.cpp's
# collectives on both ranks; a rank that throws ends the whole job within 30 s, naming
# the rank. (Training on 2 ranks: tests/dist_train_test.sh.)
set -u
check=$1
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mpirun=(mpirun --allow-run-as-root --oversubscribe --mca btl self,vader -np 2)
passed=0
fail() { echo "FAIL: $*"; echo "dist_test: $passed passed, 1 failed"; exit 1; }

out=$(timeout 120 "${mpirun[@]}" "$check" 2>&1) || fail "the collectives: $out"
[ "$(grep -c "^dist_check rank [01]: [0-9]* passed, 0 failed" <<<"$out")" -eq 2 ] || fail "not both ranks passed: $out"
passed=$((passed + 1))

start=$(date +%s)
out=$(timeout 60 "${mpirun[@]}" "$check" --throw-on-rank 1 2>&1)
rc=$?
elapsed=$(( $(date +%s) - start ))
[ "$rc" -ne 0 ] || fail "a failed rank left the job's exit status 0: $out"
[ "$rc" -ne 124 ] || fail "the job hung in a collective after rank 1 failed: $out"
[ "$elapsed" -le 30 ] || fail "the job took ${elapsed} s to end after rank 1 failed"
grep -q "(rank 1): error: a test failure on rank 1" <<<"$out" || fail "the failed rank is not named: $out"
grep -q "passed a barrier" <<<"$out" && fail "a rank went past a barrier a failed rank never reached: $out"
passed=$((passed + 1))

echo "dist_test: $passed passed, 0 failed"
