#!/usr/bin/env bash
# Data-parallel training under mpirun -np 2 on this machine:
# - tests/dist_train_check.cpp (equivalence with one process, BatchNorm, freezing);
# - `egeria train` as 2 ranks: rank 1 killed with SIGKILL, and rank 1 throwing (eg_fit
#   --fail-at, on the same run), each end the job non-zero within 30 s naming the rank, with the
#   last checkpoint valid; --resume on 2 ranks then ends bit-identical to an uninterrupted
#   2-rank run, and on 1 rank with the same global batch completes.
set -u
check=$1
egeria=$2
fit=$3
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mpirun=(mpirun --allow-run-as-root --oversubscribe --mca btl self,vader)
passed=0
fail() { echo "FAIL: $*"; echo "dist_train_test: $passed passed, 1 failed"; exit 1; }

out=$(timeout 600 "${mpirun[@]}" -np 2 "$check" "$work" 2>&1) || fail "dist_train_check: $out"
echo "$out" | grep "^dist_train_check"
[ "$(grep -c "^dist_train_check rank [01]: [0-9]* passed, 0 failed" <<<"$out")" -eq 2 ] || fail "not both ranks passed: $out"
passed=$((passed + 1))

# ResNet-20 on 512 synthetic images, global batch 64 (8 steps an epoch), 3 epochs.
run=(train --model resnet20 --dataset synthetic --train-limit 512 --test-limit 128 --epochs 3 --lr 0.05
     --threads 1 --checkpoint-every 4 --log-every 1 --freeze static --static-modules 1 --static-epoch 1)
timeout 300 "${mpirun[@]}" -np 2 "$egeria" "${run[@]}" --batch-size 32 --out "$work/full" >"$work/full.log" 2>&1 \
  || fail "the uninterrupted 2-rank run: $(cat "$work/full.log")"
passed=$((passed + 1))

# Rank 1 killed once the run has checkpointed (step 8 or later).
timeout 300 "${mpirun[@]}" -np 2 "$egeria" "${run[@]}" --batch-size 32 --out "$work/killed" >"$work/killed.log" 2>&1 &
job=$!
for _ in $(seq 3000); do
  [ "$(cat "$work/killed/metrics.jsonl" 2>/dev/null | grep -c '"type":"step"')" -ge 10 ] && break
  sleep 0.05
done
victim=""
for p in $(pgrep -f "$egeria train"); do
  tr '\0' '\n' </proc/"$p"/environ 2>/dev/null | grep -qx "OMPI_COMM_WORLD_RANK=1" && victim=$p
done
[ -n "$victim" ] || fail "rank 1's process was not found"
start=$(date +%s)
kill -9 "$victim"
wait "$job"
rc=$?
elapsed=$(( $(date +%s) - start ))
[ "$rc" -ne 0 ] || fail "a killed rank left the job's exit status 0: $(cat "$work/killed.log")"
[ "$rc" -ne 124 ] || fail "the job hung after rank 1 was killed: $(cat "$work/killed.log")"
[ "$elapsed" -le 30 ] || fail "the job took ${elapsed} s to end after rank 1 was killed"
grep -qi "rank 1" "$work/killed.log" || fail "the killed rank is not named: $(cat "$work/killed.log")"
passed=$((passed + 1))

# Rank 1 throws at step 13: the job ends at once, naming it.
start=$(date +%s)
timeout 120 "${mpirun[@]}" -np 2 "$fit" "$work/killed/config.json" --resume --fail-at 1:13 >"$work/threw.log" 2>&1
rc=$?
elapsed=$(( $(date +%s) - start ))
[ "$rc" -ne 0 ] && [ "$rc" -ne 124 ] || fail "a throwing rank: exit $rc: $(cat "$work/threw.log")"
[ "$elapsed" -le 30 ] || fail "the job took ${elapsed} s to end after rank 1 threw"
grep -q "error (rank 1 of 2): a test failure on rank 1 at step 13" "$work/threw.log" \
  || fail "the throwing rank is not named: $(cat "$work/threw.log")"
passed=$((passed + 1))

# Resumed on 2 ranks from what the failures left: the uninterrupted run's weights, bit for bit.
cp -r "$work/killed" "$work/killed1"
timeout 300 "${mpirun[@]}" -np 2 "$egeria" "${run[@]}" --batch-size 32 --resume --out "$work/killed" \
  >"$work/resumed.log" 2>&1 || fail "the 2-rank resume: $(cat "$work/resumed.log")"
cmp -s "$work/full/model.safetensors" "$work/killed/model.safetensors" \
  || fail "the resumed 2-rank run's weights differ from the uninterrupted run's"
cmp -s "$work/full/metrics.jsonl" "$work/killed/metrics.jsonl" 2>/dev/null ||
  diff <(grep -o '"loss":[^,]*' "$work/full/metrics.jsonl") <(grep -o '"loss":[^,]*' "$work/killed/metrics.jsonl") \
    >/dev/null || fail "the resumed run's losses differ from the uninterrupted run's"
passed=$((passed + 1))

# Resumed on 1 rank: --batch-size 64 keeps the global batch, and it says so.
timeout 300 "$egeria" "${run[@]}" --batch-size 32 --resume --out "$work/killed1" >"$work/one.log" 2>&1 \
  || fail "the 1-rank resume: $(cat "$work/one.log")"
grep -q "resuming a run of 2 rank(s) on 1: --batch-size 64 per rank keeps the global batch of 64" "$work/one.log" \
  || fail "the 1-rank resume did not say how it kept the global batch: $(cat "$work/one.log")"
grep -q '"global_batch_size": 64' "$work/killed1/summary.json" || fail "summary: $(cat "$work/killed1/summary.json")"
passed=$((passed + 1))
echo "dist_train_test: $passed passed, 0 failed"
