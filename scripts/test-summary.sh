#!/bin/sh
# The closing summary of `make test`: for each stage, CTest's count of passed tests, and
# the skipped ones grouped by the reason each printed when it skipped (a GPU test on a
# machine without a GPU, a program that was not built, ...), with how many of each layer.
#
#   scripts/test-summary.sh "main suite:build" "sanitizers:build-asan" "fuzzing:build-fuzz"
#
# Each build directory holds the ctest-output.log that `ctest -O` wrote (which tests were
# skipped) and CTest's Testing/Temporary/LastTest.log (what each test printed).
set -eu

for stage in "$@"; do
  name=${stage%%:*}
  dir=${stage#*:}
  log=$dir/ctest-output.log
  last=$dir/Testing/Temporary/LastTest.log
  if [ ! -f "$log" ]; then
    printf '   %-11s no results (%s is missing)\n' "$name" "$log"
    continue
  fi
  [ -f "$last" ] || last=/dev/null
  awk -v name="$name" -v log_file="$log" '
    # Pass 1 (ctest-output.log): "\t281 - cuda:some test (Skipped)" and the totals line.
    FNR == NR {
      if ($0 ~ /tests passed/) totals = $0
      if ($0 ~ /^[ \t]*[0-9]+ - .* \(Skipped\)$/) {
        test = $0
        sub(/^[ \t]*[0-9]+ - /, "", test)
        sub(/ \(Skipped\)$/, "", test)
        skipped[test] = 1
        n_skipped++
      }
      next
    }
    # Pass 2 (LastTest.log): "12/373 Test: <name>", "Output:", a rule, then the output.
    /^[0-9]+\/[0-9]+ Test: / { current = $0; sub(/^[0-9]+\/[0-9]+ Test: /, "", current); state = 0; next }
    /^Output:$/ { state = 1; next }
    state == 1 { state = 2; next }  # the rule under "Output:"
    # Catch2 prints a "Filters: <test name>" line (and a blank one) before the test output.
    state == 2 && ($0 ~ /^Filters: / || $0 == "") { next }
    state == 2 {
      if ((current in skipped) && !(current in reason) && $0 != "<end of output>") reason[current] = $0
      state = 0
    }
    END {
      printf "   %-11s %s; %d skipped%s\n", name, totals, n_skipped, n_skipped ? ":" : ""
      for (test in skipped) {
        why = (test in reason) ? reason[test] : "(it printed no reason)"
        layer = test
        sub(/:.*/, "", layer)
        count[why]++
        per_layer[why, layer]++
        layers[layer] = 1
      }
      for (why in count) {
        split_list = ""
        for (layer in layers)
          if ((why, layer) in per_layer)
            split_list = split_list (split_list == "" ? "" : ", ") layer " " per_layer[why, layer]
        printf "                 %d: %s (%s)\n", count[why], why, split_list
      }
      if (n_skipped) printf "                 (the tests by name: grep Skipped %s)\n", log_file
    }
  ' "$log" "$last"
done
