//! The guide: how to put the pieces together, chapter by chapter. Every code block here is
//! compiled as a test (the ones that need a server are built, not run), so what you copy
//! compiles against this version of the crate.
//!
//! Start with [a first stack](first_stack): two SMTP relays in failover, their breakers
//! shared through Redis, and an outbox for the hour when both are down. Then, as you need
//! them:
//!
//! | chapter | what it covers |
//! |---|---|
//! | [A first stack](first_stack) | two relays, one Redis, an outbox: every step |
//! | [The breaker's rules](breaker) | when it opens, its one probe, what trips it and what never does, shadow mode, slow calls, per-domain breakers |
//! | [Pool and retry](pool_and_retry) | failover by priority or in turn, retries that wait as the breaker says, a retry budget, batches |
//! | [A fleet on Redis](redis_fleet) | one breaker for every process: TLS and ACL users, Redis Cluster, a quorum |
//! | [SMTP](smtp) | the crate's own SMTP client: one round trip a message, what a hostile server cannot do, what each answer means |
//! | [SES and the HTTP APIs](ses_and_http) | Amazon SES, Postmark, Resend, SendGrid, Mailgun, Microsoft Graph: their errors, and which may deliver twice |
//! | [The outbox](outbox) | mail kept in SQLite or PostgreSQL until a provider takes it: when it goes, at least once or at most once, a fleet of workers |
//! | [Rate limits](rate_limits) | pacing to a provider's quota, adapting to its throttles, one budget for a fleet |
//! | [The configuration reference](configuration) | the whole stack from one DSN or one TOML document: every option in one table |
//! | [Reputation](reputation) | verified webhooks, the suppression list, and the breaker that holds a member's mail before the provider suspends the account |
//! | [Tower](tower) | the breaker as a `tower::Layer` for any service, the mail stack as a tower service, a tower service as a transport; beside tower-resilience |
//! | [Operating](operating) | asking a breaker what it saw, isolating a provider, the metrics |
//! | [Reliability](reliability) | what was done to the crate to see it keep its promises |
//! | [Performance](performance) | what a breaker, a limiter, the SMTP client and the outbox cost, beside their peers |
//!
//! A chapter whose examples need a feature the docs were built without says which; the
//! features are in the crate's `Cargo.toml` (`smtp`, `outbox` and `config` are on by
//! default; `redis`, `ses`, `postmark`, `resend`, `sendgrid`, `mailgun`, `postgres`,
//! `metrics`, `admin`, `webhooks`, `graph` and `tower` are not).

/// Declares a chapter: its text from `$file` when the crate is built with `$features`
/// (its examples need them to compile), else a line that names them.
macro_rules! chapter {
    ($(#[$attr:meta])* $name:ident, $file:literal, [$($feature:literal),*]) => {
        $(#[$attr])*
        #[cfg_attr(all($(feature = $feature),*), doc = include_str!($file))]
        #[cfg_attr(
            not(all($(feature = $feature),*)),
            doc = concat!(
                "This chapter's examples need the features ",
                $("`", $feature, "` ",)*
                "(build the docs with `--all-features`)."
            )
        )]
        pub mod $name {}
    };
}

chapter!(first_stack, "first_stack.md", ["smtp", "redis", "outbox"]);
chapter!(breaker, "breaker.md", ["smtp"]);
chapter!(
    pool_and_retry,
    "pool_and_retry.md",
    ["smtp", "ses", "postmark"]
);
chapter!(redis_fleet, "redis_fleet.md", ["smtp", "redis"]);
chapter!(smtp, "smtp.md", ["smtp"]);
chapter!(
    ses_and_http,
    "ses_and_http.md",
    ["ses", "postmark", "resend", "sendgrid", "mailgun", "graph"]
);
chapter!(outbox, "outbox.md", ["smtp", "outbox", "postgres"]);
chapter!(rate_limits, "rate_limits.md", ["ses", "redis", "webhooks"]);
chapter!(
    configuration,
    "configuration.md",
    ["smtp", "config", "outbox"]
);
chapter!(
    reputation,
    "reputation.md",
    [
        "smtp", "config", "outbox", "ses", "postmark", "admin", "webhooks"
    ]
);
chapter!(tower, "tower.md", ["tower", "smtp", "redis"]);
chapter!(operating, "operating.md", ["smtp", "config"]);
chapter!(reliability, "reliability.md", []);
chapter!(performance, "performance.md", []);
