#!/usr/bin/env bash
# Runs one test binary again and again (CI=true, so a missing server fails), optionally while
# `stress` keeps every core busy, and prints each failing run's output: how a flaky test is
# found before CI finds it.
#
#   scripts/flaky.sh smtp_auth              # the binary tests/smtp_auth.rs, 100 runs
#   scripts/flaky.sh smtp_auth 500          # 500 runs
#   STRESS=1 scripts/flaky.sh smtp_auth 500 # under `stress --cpu <cores>` (apt-get install stress)
#   scripts/flaky.sh --servers              # every binary that starts a real server: 100 runs
#                                           # each for those that finish within 10 s, 20 for the rest
#
# Prints one line per binary: runs, failures, the time of one run (median) and of all runs.
# Each failing run's output is kept in target/flaky/<binary>-<run>.log. Exits 1 if any run failed.
set -euo pipefail
cd "$(dirname "$0")/.."
export CI=true

mkdir -p target/flaky

if [ "${STRESS:-0}" = 1 ]; then
    command -v stress >/dev/null 2>&1 || {
        echo "scripts/flaky.sh: STRESS=1 needs stress (apt-get install stress)" >&2
        exit 1
    }
    # One busy loop per core, in a process group of its own so that all of them stop with it.
    setsid stress --cpu "$(nproc)" --quiet &
    hog=$!
    trap 'kill -- -"$hog" 2>/dev/null || true' EXIT
fi

# The path of the test binary tests/<name>.rs, built with every feature.
binary_of() {
    cargo test --all-features --no-run --message-format=json --test "$1" 2>/dev/null \
        | grep -o '"executable":"[^"]*"' | grep "/$1-" | head -n 1 | cut -d'"' -f4
}

# Runs binary <name> <runs> times; prints its line; returns 1 if a run failed.
run_binary() {
    local name=$1 runs=$2 binary failures=0 times=()
    binary=$(binary_of "$name")
    [ -n "$binary" ] || { echo "scripts/flaky.sh: no test binary for tests/$name.rs" >&2; return 1; }
    local all_start=$SECONDS
    for run in $(seq 1 "$runs"); do
        local start log
        start=$(date +%s%N)
        log="target/flaky/$name-$run.log"
        if "$binary" >"$log" 2>&1; then
            rm -f "$log"
        else
            failures=$((failures + 1))
            echo "--- $name run $run of $runs FAILED ($log):" >&2
            grep -E '^(test .* FAILED|---- |thread .* panicked)' "$log" >&2 || tail -n 20 "$log" >&2
        fi
        times+=($(( ($(date +%s%N) - start) / 1000000 )))
    done
    local median
    median=$(printf '%s\n' "${times[@]}" | sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}')
    printf '%-28s %4d runs  %3d failed  %6.2f s a run (median)  %5d s in all\n' \
        "$name" "$runs" "$failures" "$(awk -v ms="$median" 'BEGIN {print ms / 1000}')" "$((SECONDS - all_start))"
    [ "$failures" -eq 0 ]
}

# The test binaries that start a real server through tests/support's launchers.
server_binaries() {
    grep -lE '(SmtpSink|Aiosmtpd|Postfix|RedisServer|RedisCluster|PostgresServer|Moto)::start' tests/*.rs \
        | xargs -n1 basename | sed 's/\.rs$//' | sort
}

status=0
if [ "${1:-}" = "--servers" ]; then
    for name in $(server_binaries); do
        # One timed run decides how many: 100 for a binary within 10 s, 20 for a longer one.
        binary=$(binary_of "$name")
        start=$SECONDS
        "$binary" >/dev/null 2>&1 || true
        runs=100
        [ $((SECONDS - start)) -gt 10 ] && runs=20
        run_binary "$name" "$runs" || status=1
    done
else
    [ $# -ge 1 ] || { sed -n '2,13p' "$0" >&2; exit 2; }
    run_binary "$1" "${2:-100}" || status=1
fi
exit "$status"
