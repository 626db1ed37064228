#!/usr/bin/env bash
# Mutation testing with cargo-mutants: injects bugs into the files that hold the crate's
# promises and checks that the tests catch each one. Not part of CI's critical path (a full
# run takes hours on two cores); run it by hand after changing one of these files:
#
#   scripts/mutants.sh            # every group below
#   scripts/mutants.sh retry pool # some groups
#
# Each group mutates its files and runs only the test binaries that speak for them (the slow
# soak and chaos runs are left out), with the `mutants` profile (no debug info) to keep each
# build short. Results land in mutants.out/<group>/mutants.out/. A surviving mutant is either a missing
# test (add one named as the rule it keeps) or an equivalent mutant (mark the function
# #[mutants::skip] with a one-line reason).
#
# MUTANTS_ARGS adds cargo-mutants options, e.g. MUTANTS_ARGS=--in-place in a spare worktree
# to build every group in one target directory instead of a fresh copy per group.
set -euo pipefail
cd "$(dirname "$0")/.."

command -v cargo-mutants >/dev/null 2>&1 || cargo install cargo-mutants --locked

# --in-place mutates the checkout itself. A run killed mid-mutant leaves that mutant in the
# source, and the next run would take it for the baseline; refuse to start on changed sources.
if [[ " ${MUTANTS_ARGS:-} " == *" --in-place "* ]] && ! git diff --quiet -- src tests; then
    echo "scripts/mutants.sh: --in-place needs unchanged src/ and tests/ (a killed run may have left a mutant):" >&2
    git diff --stat -- src tests >&2
    exit 1
fi

declare -A files tests features
files[machine]="src/machine/mod.rs src/machine/policy.rs"
tests[machine]="--lib --test=machine_model --test=store_scenarios --test=breaker --test=extreme_settings --test=operate"
# Without `metrics`: with it, every send is also timed and counted through the breaker's kept
# handles (the gate group's `--test=metrics` reads those), on the same paths.
files[breaker]="src/breaker/future.rs src/breaker/mod.rs src/breaker/scope.rs src/transport.rs src/adapters/lettre.rs"
features[breaker]="--features=smtp,outbox,config"
tests[breaker]="--lib --test=breaker --test=cancellation --test=scope --test=operate --test=batch_failures --test=pool --test=retry --test=extreme_settings"
files[batch]="src/breaker/batch.rs"
tests[batch]="--lib --test=breaker --test=batch_failures --test=cancellation --test=operate"
files[gate]="src/breaker/gate.rs src/breaker/recording.rs"
tests[gate]="--lib --test=breaker --test=batch_failures --test=cancellation --test=operate --test=scope --test=extreme_settings --test=metrics"
# The retry sends again the recipients a receipt deferred (retry_deferred).
files[retry]="src/retry/mod.rs src/retry/backoff.rs src/retry/budget.rs"
tests[retry]="--lib --test=retry --test=retry_deferred --test=batch_failures --test=extreme_settings --test=cancellation --test=metrics"
files[pool]="src/pool.rs src/cascade/state.rs src/cascade/stream.rs src/panicked.rs"
tests[pool]="--lib --test=pool --test=retry --test=batch_failures --test=cancellation --test=metrics"
# Where the breakers' state lives: the memory store's lock-free words and the bounded map of
# per-domain breakers; and the Redis store's script, quorum and connections.
files[stores]="src/store/memory.rs src/store/lru.rs"
tests[stores]="--lib --test=store_scenarios --test=scope --test=breaker --test=operate --test=machine_model"
files[redis-store]="src/store/redis/mod.rs src/store/redis/script.rs src/store/redis/quorum.rs src/store/redis/connection.rs"
# The store lends its connection, timeout and retry interval to the rate limiters shared
# through it, whose tests (rate_redis) speak for those too.
tests[redis-store]="--lib --test=redis_store --test=redis_store_recovery --test=redis_cluster --test=redis_quorum --test=redis_quorum_fleet --test=redis_fleet --test=redis_operate --test=redis_script_model --test=store_scenarios --test=rate_redis --test=reputation_redis"
files[redis]="src/store/redis/health.rs src/store/redis/remote.rs src/store/redis/tls.rs"
tests[redis]="--lib --test=redis_store --test=redis_store_recovery --test=store_scenarios --test=redis_script_model --test=redis_tls"
# The HTTP APIs: every provider's error table, the reading of a message into JSON fields, and
# the frame every provider shares (its answer rules, the key's redaction).
files[http]="src/adapters/http/mod.rs src/adapters/http/frame.rs src/adapters/http/key.rs src/adapters/http/mime.rs src/adapters/http/postmark/classify.rs src/adapters/http/resend/classify.rs src/adapters/http/sendgrid/classify.rs src/adapters/http/mailgun/classify.rs"
tests[http]="--lib --test=postmark --test=resend --test=sendgrid --test=mailgun --test=api_keys --test=logs"
files[ses]="src/adapters/ses/classify.rs src/adapters/ses.rs"
tests[ses]="--lib --test=ses"

# The SMTP client: its pure parts (reply reader, command writer, capabilities, and the reading
# of a reply into an error: rate limit or not, too many recipients, the accepted transaction)
# by their unit tests and fuzz module; the transaction engine, connections, pool, builder and
# transport by the tests against scripted, hostile and real servers, the OAuth 2.0 login
# (oauth_smtp) and the builder's checks (smtp_builder) included.
files[smtp_wire]="src/adapters/smtp/reply.rs src/adapters/smtp/command.rs src/adapters/smtp/capabilities.rs src/adapters/smtp/classify.rs"
tests[smtp_wire]="--lib"
files[smtp]="src/adapters/smtp/transaction.rs src/adapters/smtp/connection.rs src/adapters/smtp/pool.rs src/adapters/smtp/builder.rs src/adapters/smtp/mod.rs"
tests[smtp]="--lib --test=smtp_hostile --test=smtp_engine --test=garbage_replies --test=smtp_connections --test=smtp_sink --test=smtp_sink_pipelining --test=smtp_postfix --test=smtp_auth --test=smtp_tls --test=retry_deferred --test=oauth_smtp --test=smtp_builder"
# What a send answers: the receipt's recipients (deferred, maybe delivered) and transactions,
# and the error's marks (not attempted), by the SMTP engine that fills them, the retry that
# reads them, and the pool that marks errors not attempted.
files[receipt]="src/receipt.rs"
tests[receipt]="--lib --test=smtp_engine --test=retry_deferred --test=pool"

# The outbox: what an answer does to a message (pure), the worker's loop, the rows, the
# transport in front of it, and each database's statements, by the rules run on each.
files[outbox]="src/outbox/schedule.rs src/outbox/worker.rs src/outbox/record.rs src/outbox/transport.rs src/outbox/mod.rs src/outbox/sqlite.rs src/outbox/lanes.rs src/outbox/supervise.rs src/outbox/options.rs src/outbox/inspect.rs src/outbox/gauges.rs"
tests[outbox]="--lib --test=outbox_sqlite --test=metrics --test=cli"
# Its unit tests (an enqueue maybe queued), its rules, and the operator page reading dead
# letters through its pool.
files[outbox-postgres]="src/outbox/postgres.rs"
tests[outbox-postgres]="--lib --test=outbox_postgres --test=admin --test=suppression_postgres"
# The rate limiter: the pure GCRA and adaptive rate, the local and shared limiters, the
# transport. Its Lua script is held by scripts/lua_mutants.sh (cargo-mutants reads no Lua).
files[rate]="src/rate/gcra.rs src/rate/adaptive.rs src/rate/local.rs src/rate/shared.rs src/rate/mod.rs src/rate/builder.rs"
tests[rate]="--lib --test=rate --test=rate_redis --test=rate_script_model --test=rate_local_and_script --test=breaker --test=metrics --test=logs"
# The ground floor every builder and room stands on: ConfigError and its checks, the metrics'
# names and their descriptions.
files[ground]="src/error.rs src/metrics.rs"
tests[ground]="--lib --test=metrics --test=config --test=extreme_settings"
# The whole stack from one DSN or TOML: the DSN parser, the tree reader with its paths, the
# providers' URLs, the config types, and the build.
files[config]="src/config/dsn.rs src/config/read.rs src/config/tree.rs src/config/provider.rs src/config/mailer.rs src/config/smtp_url.rs"
tests[config]="--lib --test=config --test=config_build --test=config_equivalence --test=config_equivalence_redis --test=config_ses --test=config_smtp_url --test=config_reputation --test=config_webhooks --test=admin_reputation --test=guide_configuration --test=extreme_settings"
# SMTP's login with OAuth 2.0: the token cache and the mechanisms, the token endpoints and
# their settings, the HTTP policy they share with the providers, and the SMTP URL's one reader.
files[oauth]="src/oauth/mod.rs src/oauth/endpoint.rs src/oauth/settings.rs src/adapters/http_policy.rs src/config/smtp_url.rs"
tests[oauth]="--lib --test=oauth_smtp --test=oauth_endpoint --test=oauth_dsn --test=config --test=config_smtp_url --test=logs --test=postmark"
# The operator page: its guard (token, origin, host), its credential, its reads and actions,
# its chart, and the breaker's history of changes it shows. The browser test is left out
# (slow); the router tests speak for the page.
files[admin]="src/admin/mod.rs src/admin/guard.rs src/admin/credential.rs src/admin/throttle.rs src/admin/serve.rs src/admin/read.rs src/admin/actions.rs src/admin/chart.rs src/admin/page.rs src/outbox/admin_reads.rs src/breaker/events.rs"
tests[admin]="--lib --test=admin --test=redis_store"
# The command: what it prints, its exit codes, and what it hides; how it reads a message;
# what it opens, and whom `serve` lets in.
files[cli]="src/bin/mail-breaker/exit.rs src/bin/mail-breaker/redact.rs src/bin/mail-breaker/output.rs src/bin/mail-breaker/send.rs src/bin/mail-breaker/eml.rs src/bin/mail-breaker/outbox.rs src/bin/mail-breaker/breakers.rs src/bin/mail-breaker/check.rs src/bin/mail-breaker/trace.rs src/bin/mail-breaker/stack.rs src/bin/mail-breaker/serve.rs src/bin/mail-breaker/tls.rs"
tests[cli]="--bins --test=cli --test=cli_serve"
# Reputation (issue 64): the webhooks' verifiers and readers, by their unit tests and each
# provider's route tests (the cross-checks against the providers' own libraries included);
# the suppression list's rules, stores and transport; the reputation breaker's window,
# rules, stores and transport, and the one event vocabulary.
files[webhooks]="src/webhooks/mod.rs src/webhooks/sns.rs src/webhooks/ses.rs src/webhooks/sendgrid.rs src/webhooks/mailgun.rs src/webhooks/resend.rs src/webhooks/postmark.rs src/webhooks/timestamp.rs src/webhooks/answer.rs src/webhooks/hex.rs src/webhooks/json.rs"
features[webhooks]="--features=webhooks,smtp,config"
tests[webhooks]="--lib --test=webhooks_sns --test=webhooks_sendgrid --test=webhooks_mailgun --test=webhooks_resend --test=webhooks_postmark"
files[suppression]="src/suppression/mod.rs src/suppression/rules.rs src/suppression/import.rs src/suppression/sql.rs src/suppression/redis.rs src/suppression/transport.rs"
features[suppression]="--features=webhooks,smtp,config,postgres,redis,metrics"
tests[suppression]="--lib --test=suppression_sqlite --test=suppression_postgres --test=suppression_redis --test=suppression_smtp_sink"
files[reputation]="src/reputation/breaker.rs src/reputation/window.rs src/reputation/rules.rs src/reputation/store.rs src/reputation/redis.rs src/reputation/transport.rs src/events.rs"
tests[reputation]="--lib --test=reputation --test=reputation_redis --test=reputation_throttle --test=reputation_processes --test=config_reputation"
# Their configuration, page and command: the webhooks' keys, the reputation cards and the
# suppression search on the page, SES's account, and `suppressions` / `reputation`.
files[reputation-tools]="src/config/webhooks.rs src/admin/reputation.rs src/admin/suppressions.rs src/adapters/ses/account.rs src/bin/mail-breaker/reputation.rs src/bin/mail-breaker/suppressions.rs"
tests[reputation-tools]="--lib --bins --test=config_webhooks --test=admin_reputation --test=cli_reputation --test=cli --test=cli_serve_webhooks"
groups=("$@")
if [ "${#groups[@]}" -eq 0 ]; then
    groups=(machine breaker batch gate retry pool redis stores redis-store smtp_wire smtp receipt http ses outbox outbox-postgres rate ground config oauth admin cli webhooks suppression reputation reputation-tools)
fi

status=0
for group in "${groups[@]}"; do
    args=()
    for file in ${files[$group]}; do
        args+=(--file "$file")
    done
    mkdir -p "mutants.out/$group"
    # Each test target as a cargo argument, so that only these are built, not every test.
    for target in ${tests[$group]}; do
        args+=(--cargo-arg="$target")
    done
    # The machine model's 10,000 random sequences per mutant would take most of the run;
    # 1,000 still find every broken rule that the fixed scenarios miss.
    cases="${PROPTEST_CASES:-}"
    if [[ "$group" =~ ^(machine|stores)$ ]] && [ -z "$cases" ]; then cases=1000; fi
    # shellcheck disable=SC2086 # MUTANTS_ARGS is words on purpose
    env ${cases:+PROPTEST_CASES=$cases} cargo mutants "${args[@]}" ${features[$group]:---all-features} --profile mutants --timeout-multiplier 3 \
        --output "mutants.out/$group" ${MUTANTS_ARGS:-} || status=$?
done
exit "$status"
