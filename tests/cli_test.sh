#!/usr/bin/env bash
# The egeria CLI end to end: bad flags fail clearly; a run killed with SIGKILL at an
# arbitrary moment and resumed ends with weights bit-identical to an uninterrupted run;
# --config replays a run from its config.json bit for bit; egeria report reads a run's files.
set -u
egeria=$1
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
passed=0
fail() { echo "FAIL: $*"; echo "cli_test: $passed passed, 1 failed"; exit 1; }
ok() { passed=$((passed + 1)); }

# --- bad input: non-zero exit and a message naming the problem
out=$("$egeria" train --model resnet99 --out "$work/x" 2>&1) && fail "unknown model accepted"
grep -q "unknown model 'resnet99'" <<<"$out" || fail "unknown model message: $out"; ok
out=$("$egeria" train --epochs -3 2>&1) && fail "negative epochs accepted"
grep -q -- "--epochs must be positive, got -3" <<<"$out" || fail "bad epochs message: $out"; ok
out=$("$egeria" train --lr -1 2>&1) && fail "negative lr accepted"
grep -q -- "--lr must be a positive number, got -1" <<<"$out" || fail "bad lr message: $out"; ok
out=$("$egeria" train --optimizer lamb 2>&1) && fail "unknown optimizer accepted"
grep -q -- "--optimizer must be sgd or adamw, got 'lamb'" <<<"$out" || fail "unknown optimizer message: $out"; ok
out=$("$egeria" train --config "$work/none.json" 2>&1) && fail "missing --config file accepted"
grep -q -- "--config" <<<"$out" || fail "missing --config message: $out"; ok
"$egeria" train --help | grep -q -- "--stop-after-steps" && fail "the test hook --stop-after-steps is in --help"
"$egeria" train --help | grep -q "^Layer freezing:" || fail "--help has no 'Layer freezing' group"; ok
out=$("$egeria" train --dataset cifar10 --data-dir "$work/none" --out "$work/x" 2>&1) && fail "missing data accepted"
grep -q "data_batch_1.bin" <<<"$out" || fail "missing data message: $out"; ok
out=$("$egeria" train --dataset synthetic --freeze egeria --freeze-cache on --out "$work/x" 2>&1) \
  && fail "--freeze-cache on accepted with batch-statistics BatchNorms"
grep -q -- "--freeze-cache on needs --freeze-bn running" <<<"$out" || fail "freeze-cache message: $out"; ok
out=$("$egeria" train --augment-mode weekly 2>&1) && fail "unknown --augment-mode accepted"
grep -q -- "--augment-mode" <<<"$out" || fail "augment-mode message: $out"; ok
out=$("$egeria" train --freeze egeria --freeze-apply later 2>&1) && fail "unknown --freeze-apply accepted"
grep -q -- "--freeze-apply" <<<"$out" || fail "freeze-apply message: $out"; ok
out=$("$egeria" train --freeze egeria --freeze-refreeze-tolerance first3 2>&1) && fail "unknown --freeze-refreeze-tolerance accepted"
grep -q -- "--freeze-refreeze-tolerance" <<<"$out" || fail "freeze-refreeze-tolerance message: $out"; ok
for v in 0 -3 often 12x; do
  out=$("$egeria" train --freeze egeria --freeze-bootstrap-interval "$v" 2>&1) && fail "--freeze-bootstrap-interval $v accepted"
  grep -q -- "--freeze-bootstrap-interval must be auto, n, off or a positive number" <<<"$out" \
    || fail "freeze-bootstrap-interval $v message: $out"
  ok
done
for v in -1 soon; do
  out=$("$egeria" train --freeze egeria --freeze-bn running --freeze-bn-settle "$v" 2>&1) && fail "--freeze-bn-settle $v accepted"
  grep -q -- "--freeze-bn-settle must be auto or a non-negative number of steps" <<<"$out" \
    || fail "freeze-bn-settle $v message: $out"
  ok
done
out=$("$egeria" train --dataset synthetic --freeze egeria --freeze-bn-settle 5 --out "$work/x" 2>&1) \
  && fail "--freeze-bn-settle accepted with batch-statistics BatchNorms"
grep -q -- "which only --freeze-bn running does" <<<"$out" || fail "freeze-bn-settle message: $out"; ok
for v in 0 150 half 50%; do
  out=$("$egeria" train --dataset synthetic --freeze egeria --freeze-reference-max-load "$v" --out "$work/x" 2>&1) \
    && fail "--freeze-reference-max-load $v accepted"
  grep -q -- "--freeze-reference-max-load must be auto or a percentage" <<<"$out" \
    || fail "freeze-reference-max-load $v message: $out"
  ok
done
out=$("$egeria" train --dataset synthetic --freeze egeria --freeze-reference-calibration -1 --out "$work/x" 2>&1) \
  && fail "negative --freeze-reference-calibration accepted"
grep -q -- "--freeze-reference-calibration" <<<"$out" || fail "freeze-reference-calibration message: $out"; ok
out=$("$egeria" eval --out "$work/none" 2>&1) && fail "eval without checkpoint accepted"
grep -q "checkpoint.safetensors" <<<"$out" || fail "eval message: $out"; ok

# --- kill -9 and resume
args=(train --model resnet20 --dataset synthetic --train-limit 256 --test-limit 64 --batch-size 32 --epochs 2
      --threads 2 --seed 5 --checkpoint-every 1 --log-every 1)
"$egeria" "${args[@]}" --out "$work/full" >/dev/null || fail "uninterrupted run failed"
"$egeria" "${args[@]}" --out "$work/killed" >/dev/null &
pid=$!
# wait for a few steps' worth of checkpoints, then kill without warning
for _ in $(seq 1 600); do
  [ -f "$work/killed/metrics.jsonl" ] && [ "$(grep -c '"type":"step"' "$work/killed/metrics.jsonl")" -ge 5 ] && break
  sleep 0.05
done
kill -9 "$pid" 2>/dev/null
wait "$pid" 2>/dev/null
[ -f "$work/killed/summary.json" ] && fail "the run finished before it could be killed"
out=$("$egeria" "${args[@]}" --out "$work/killed" --resume) || fail "resume failed"
grep -q "^resuming .*(step [1-9][0-9]*)" <<<"$out" || fail "the second run did not resume: $out"
cmp "$work/full/model.safetensors" "$work/killed/model.safetensors" || fail "resumed weights differ from the uninterrupted run"
ok

# --- --config replays a run from its config.json; flags given beside it override it
out=$("$egeria" train --config "$work/full/config.json" 2>&1) && fail "--config without --out accepted"
grep -q -- "needs its own --out" <<<"$out" || fail "--config without --out message: $out"
[ -f "$work/full/model.safetensors" ] || fail "--config without --out touched the run it names"
ok
"$egeria" train --config "$work/full/config.json" --out "$work/replay" >/dev/null || fail "--config run failed"
cmp "$work/full/model.safetensors" "$work/replay/model.safetensors" || fail "--config did not reproduce the run"
grep -q '"out": "'"$work/replay"'"' "$work/replay/config.json" || fail "--out beside --config was not taken"
ok
# --- a finished run is never started over: refused, its files as they were
sum_before=$(sha256sum "$work/full/model.safetensors" "$work/full/metrics.jsonl")
out=$("$egeria" "${args[@]}" --lr 0.5 --out "$work/full" 2>&1) && fail "a new run over a finished one accepted"
grep -q -- "holds an earlier run (checkpoint.safetensors, model.safetensors, summary.json" <<<"$out" \
  || fail "new run over a finished one message: $out"
[ "$(sha256sum "$work/full/model.safetensors" "$work/full/metrics.jsonl")" = "$sum_before" ] \
  || fail "a refused run changed the finished run's files"
ok
# --- more threads than CPUs: refused, not a crash or a crawl
out=$("$egeria" train --threads 100000 --out "$work/t" 2>&1) && fail "--threads 100000 accepted"
grep -q -- "--threads must be 0 (all cores) or a count up to this machine's" <<<"$out" || fail "threads message: $out"
out=$("$egeria" bench step --threads -1 2>&1) && fail "bench step --threads -1 accepted"
grep -q -- "--threads must be 0 (all cores)" <<<"$out" || fail "bench threads message: $out"
ok
# --- bench step's JSON names the machine it ran on (every CPU figure names its CPU)
out=$("$egeria" bench step --model resnet20 --batch-size 4 --iterations 2 --threads 1) || fail "bench step failed: $out"
grep -q '"machine":{[^}]*"cpu":"[^"]' <<<"$out" || fail "bench step has no machine.cpu: $out"
grep -q '"cpu_isa":"[a-z]' <<<"$out" || fail "bench step has no machine.cpu_isa: $out"
ok
# --- egeria report: a finished run (here one without freezing) beside another; an unfinished one refused
out=$("$egeria" report --out "$work/full" --against "$work/replay") || fail "report failed: $out"
grep -q "^Accuracy: final test accuracy" <<<"$out" || fail "report has no accuracy line: $out"
grep -q "beside --freeze none ($work/replay/summary.json" <<<"$out" || fail "report has no comparison: $out"
ok
out=$("$egeria" report --out "$work/killed/.." 2>&1) && fail "report of a directory without a run accepted"
grep -q "the run has not finished" <<<"$out" || fail "report of no run message: $out"; ok
echo "cli_test: $passed passed, 0 failed"
