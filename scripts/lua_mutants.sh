#!/usr/bin/env bash
# Mutation testing of the fleet's rate script (src/rate/rate.lua), which cargo-mutants does
# not read: each line below changes one thing in the script (`from|to`, the first match), and
# tests/rate_script_model.rs, which checks the script against the rules on a real
# redis-server, must fail with it. Prints each mutant as caught or MISSED; exits 1 if any was
# missed. Needs redis-server. The script is restored whatever happens.
set -euo pipefail
cd "$(dirname "$0")/.."
script=src/rate/rate.lua
saved=$(mktemp)
cp "$script" "$saved"
trap 'cp "$saved" "$script"; rm -f "$saved"' EXIT

cargo test -q --all-features --test rate_script_model --no-run

missed=0
while IFS='|' read -r from to; do
    [ -z "$from" ] && continue
    cp "$saved" "$script"
    FROM="$from" TO="$to" python3 - "$script" <<'PY'
import os, sys
path = sys.argv[1]
text = open(path).read()
if os.environ["FROM"] not in text:
    sys.exit(f"not in the script: {os.environ['FROM']}")
open(path, "w").write(text.replace(os.environ["FROM"], os.environ["TO"], 1))
PY
    if CI=true cargo test -q --all-features --test rate_script_model >/dev/null 2>&1; then
        echo "MISSED  $from  ->  $to"
        missed=1
    else
        echo "caught  $from  ->  $to"
    fi
done <<'MUTANTS'
now - since < 1000000|now - since <= 1000000
now - since < 1000000|now - since < 100000
if now - since < 1000000 then|if false then
0.05 * configured|0.06 * configured
local quiet = math.floor(|local quiet = math.ceil(
math.min(configured, base + 0.05|math.max(configured, base + 0.05
rate * 0.5|rate * 0.6
math.max(rate * 0.5, floor_rate)|rate * 0.5
math.min(tonumber(ARGV[5]), configured)|tonumber(ARGV[5])
'since', string.format('%.0f', now)|'since', string.format('%.0f', now - 1)
return {2, 0, math.floor(rate * 1000)}|return {2, 0, math.floor(rate * 500)}
math.max(burst - 1, 0)|math.max(burst, 0)
tat = math.max(tat, now)|tat = tat
local slot = math.max(tat - tolerance, now)|local slot = tat - tolerance
if wait > max_wait then|if wait >= max_wait then
math.ceil(wait - max_wait)|math.floor(wait - max_wait)
string.format('%.0f', tat + interval)|string.format('%.0f', tat + interval + 1)
return {1, math.floor(wait), math.floor(rate * 1000)}|return {1, math.ceil(wait), math.floor(rate * 1000)}
local interval = 1000000 / rate|local interval = 1000000 / rate / 2
MUTANTS
exit "$missed"
