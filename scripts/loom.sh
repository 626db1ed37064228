#!/usr/bin/env bash
# The model check of the memory store's lock-free paths: builds the library's tests with
# `--cfg mail_breaker_loom` (the locks and atomic words become loom's, see src/sync.rs) in a
# target directory of its own, and runs the models in src/store/memory_loom.rs, which try
# every interleaving of two threads' sends, trips and resets. Bounded: loom's preemption
# bound, and a time limit on the whole run.
#
#   scripts/loom.sh
set -euo pipefail
cd "$(dirname "$0")/.."

export RUSTFLAGS="${RUSTFLAGS:-} --cfg mail_breaker_loom"
export LOOM_MAX_PREEMPTIONS="${LOOM_MAX_PREEMPTIONS:-3}"
timeout 1200 cargo test --target-dir target/loom --no-default-features --lib loom_model
