#!/usr/bin/env bash
# Runs CI (.ci/run: checks, examples and the whole test suite against the real servers)
# several times in a row while `stress` keeps every core busy, to show that the tests'
# timing margins hold on a loaded machine. Stops at the first failure.
#
#   scripts/stress.sh       # 10 runs
#   scripts/stress.sh 3     # 3 runs
#
# Needs `stress` (Debian package stress). Each run's output goes to target/stress/run-N.log.
set -euo pipefail
cd "$(dirname "$0")/.."

runs="${1:-10}"
command -v stress >/dev/null 2>&1 || {
    echo "scripts/stress.sh: needs stress (apt-get install stress)" >&2
    exit 1
}
mkdir -p target/stress

# One busy loop per core, in a process group of its own so that all of them stop with it.
setsid stress --cpu "$(nproc)" --quiet &
hog=$!
trap 'kill -- -"$hog" 2>/dev/null || true' EXIT

for run in $(seq 1 "$runs"); do
    start=$SECONDS
    if ! bash .ci/run >"target/stress/run-$run.log" 2>&1; then
        echo "run $run of $runs FAILED after $((SECONDS - start)) s; see target/stress/run-$run.log" >&2
        grep -E '^(test .* FAILED|---- |thread .* panicked)' "target/stress/run-$run.log" >&2 || true
        exit 1
    fi
    tests=$(grep -E '^test result: ok' "target/stress/run-$run.log" | awk '{n += $4} END {print n}')
    echo "run $run of $runs passed in $((SECONDS - start)) s ($tests tests, load average $(cut -d' ' -f1 /proc/loadavg))"
done
