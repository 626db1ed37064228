#!/usr/bin/env bash
# Mutation testing with cargo-mutants: injects bugs into the files that hold the crate's
# promises and checks that the tests catch each one. Not part of CI's critical path (a full
# run takes a long time); run it by hand after changing one of these files:
#
#   scripts/mutants.sh                      # every file below
#   scripts/mutants.sh src/retry/budget.rs  # one file
#
# Installs cargo-mutants if it is missing. A surviving mutant is either a missing test (add
# one named as the rule it keeps) or an equivalent mutant (mark the function
# #[mutants::skip] with a one-line reason).
set -euo pipefail
cd "$(dirname "$0")/.."

command -v cargo-mutants >/dev/null 2>&1 || cargo install cargo-mutants --locked

files=("$@")
if [ "${#files[@]}" -eq 0 ]; then
    files=(
        src/machine/mod.rs src/machine/policy.rs
        src/breaker/gate.rs src/breaker/batch.rs
        src/cascade/state.rs src/cascade/stream.rs
        src/pool.rs src/retry/mod.rs src/retry/backoff.rs src/retry/budget.rs
        src/store/redis/health.rs src/store/redis/remote.rs
    )
fi

args=()
for file in "${files[@]}"; do
    args+=(--file "$file")
done

# The test binaries that speak for these files; the slow soak and chaos runs are left out.
cargo mutants "${args[@]}" --all-features --timeout-multiplier 3 -- \
    --lib --test breaker --test machine_model --test store_scenarios --test operate \
    --test batch_failures --test pool --test retry --test scope --test cancellation \
    --test extreme_settings --test redis_store --test redis_store_recovery
