#!/usr/bin/env bash
# The README and docs/ against the code: every flag they mention is one that `egeria`
# (train, eval, report, bench step, export, smartfrz-train), tools/torch-to-safetensors, bench/fine_tune.py,
# bench/time_to_accuracy.py, bench/data_parallel.py,
# bench/translation_time_to_quality.py, bench/fine_tune_translation.py, bench/replay_freezing.py,
# bench/compare_pytorch.py or bench/cpu_step.py takes,
# and every repository file they name exists.
set -u
egeria=$1
root=$(cd "$(dirname "$0")/.." && pwd)
shopt -s globstar  # docs/ and its subfolders (docs/results/, docs/runs/)
docs=("$root/README.md" "$root"/docs/**/*.md)
known=$({ "$egeria" train --help; "$egeria" eval --help; "$egeria" report --help; "$egeria" bench step --help
          "$egeria" export --help; "$egeria" smartfrz-train --help
          "$root/tools/torch-to-safetensors" --help; python3 "$root/bench/fine_tune.py" --help
          python3 "$root/bench/train_smartfrz_predictor.py" --help
          python3 "$root/bench/time_to_accuracy.py" --help; python3 "$root/bench/data_parallel.py" --help
          python3 "$root/bench/translation_time_to_quality.py" --help
          python3 "$root/bench/fine_tune_translation.py" --help; python3 "$root/bench/compare_pytorch.py" --help
          python3 "$root/bench/replay_freezing.py" --help; python3 "$root/bench/cpu_step.py" --help
        } 2>&1 | grep -oE -- '--[a-z][a-z0-9-]+' | sort -u)
others="--help --prefix --install --hostfile --mca"  # cmake's, mpirun's, and every tool's
passed=0 failed=0
for flag in $(cat "${docs[@]}" | grep -oE -- '--[a-z][a-z0-9-]+' | sort -u); do
  if grep -qx -- "$flag" <<<"$known" || [[ " $others " == *" $flag "* ]]; then
    passed=$((passed + 1))
  else
    echo "FAIL: the docs mention $flag, which no egeria command (nor bench/*.py) takes"
    failed=$((failed + 1))
  fi
done
# Paths of files (an extension, or a tools/ script); docs/STYLE.md names other projects' files.
for doc in "${docs[@]}"; do
  [ "$(basename "$doc")" = STYLE.md ] && continue
  for p in $(grep -oE '\b(tools|train|bench|tests|docs|freeze|quant|cache|core|kernels|models|data|layers|optim|autograd|examples|cmake|dist)/[A-Za-z0-9_./-]*[A-Za-z0-9_]' "$doc" | sort -u); do
    [[ $p == bench/eg_bench_* ]] && p="bench/${p#bench/eg_}.cpp"  # a benchmark program, by its source
    [[ $p == tools/* || $p =~ \.(h|cpp|cu|py|md|sh|txt|cmake)$ ]] || continue
    if [ -e "$root/$p" ]; then
      passed=$((passed + 1))
    else
      echo "FAIL: $(basename "$doc") names $p, which is not in the repository"
      failed=$((failed + 1))
    fi
  done
done
echo "docs_test: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
