//! `mail-breaker reputation [reset MEMBER]`: each member's reputation breaker as the shared
//! store (Redis) holds it (tier, rates, sends counted, thresholds), the SES account's
//! enforcement status beside an SES member's, and a reset: only a person closes an open
//! reputation breaker.
//!
//! On the in-memory store a new process's counts are its own (none): the list says so and
//! shows no tier, and `reset` exits 2 rather than pretend to reach the application.

use clap::{Args, Subcommand};
use mail_breaker::config::Mailer;
use mail_breaker::reputation::{Limits, ReputationBreaker, Standing};
use serde_json::{Value, json};

use crate::exit::{Exit, Failure};
use crate::output::Out;
use crate::stack::Stack;

#[derive(Debug, Args)]
#[command(args_conflicts_with_subcommands = true)]
pub struct ReputationArgs {
    #[command(subcommand)]
    action: Option<Action>,
}

#[derive(Debug, Subcommand)]
enum Action {
    /// Close a member's reputation breaker and clear its counts, for every process sharing
    /// the store: once the cause of its bounces or complaints is mended.
    Reset {
        /// The member's name (as `reputation` lists it).
        name: String,
    },
}

/// A member's reputation as the command shows it.
struct Row {
    member: String,
    /// `None` on the in-memory store, or when the store did not answer.
    standing: Option<Standing>,
    limits: (Limits, Limits),
    failover: bool,
    /// Why the store could not be read.
    error: Option<String>,
    ses: Option<SesStatus>,
}

/// An SES account's enforcement status, or `unknown` and why.
struct SesStatus {
    enforcement: String,
    sending_enabled: Option<bool>,
    production_access: Option<bool>,
    error: Option<String>,
}

impl SesStatus {
    fn json(&self) -> Value {
        json!({
            "enforcement": self.enforcement,
            "sending_enabled": self.sending_enabled,
            "production_access": self.production_access,
            "error": self.error,
        })
    }

    /// The table's cell: `PROBATION`, `SHUTDOWN (sending disabled)`, `unknown: why`.
    fn cell(&self) -> String {
        match (&self.error, self.sending_enabled) {
            (Some(why), _) => format!("{}: {why}", self.enforcement),
            (None, Some(false)) => format!("{} (sending disabled)", self.enforcement),
            (None, _) => self.enforcement.clone(),
        }
    }
}

/// Parts per million in percent, as a number (40_000: 4.0).
fn percent_of(ppm: u32) -> f64 {
    f64::from(ppm) / 10_000.0
}

fn limits_json(limits: &Limits) -> Value {
    json!({
        "warn_percent": percent_of(limits.warn),
        "throttle_percent": percent_of(limits.throttle),
        "open_percent": percent_of(limits.open),
        "minimum_sends": limits.minimum_sends,
    })
}

impl Row {
    /// The same fields, in the same shape, as the operator page's `/api/reputation`.
    fn json(&self) -> Value {
        let window = self.standing.map(|standing| standing.window);
        json!({
            "member": self.member,
            "tier": self.standing.map(|standing| standing.tier.as_str()),
            "sends": window.map(|w| w.sends),
            "hard_bounces": window.map(|w| w.hard_bounces),
            "complaints": window.map(|w| w.complaints),
            "hard_bounce_rate": window.map(|w| w.hard_bounce_rate()),
            "complaint_rate": window.map(|w| w.complaint_rate()),
            "thresholds": {
                "hard_bounces": limits_json(&self.limits.0),
                "complaints": limits_json(&self.limits.1),
            },
            "failover": self.failover,
            "error": self.error,
            "ses": self.ses.as_ref().map(SesStatus::json),
        })
    }

    fn cells(&self) -> Vec<String> {
        let dash = || "-".to_owned();
        let rate = |rate: f64, count: u64| format!("{:.2} % ({count})", rate * 100.0);
        let window = self.standing.map(|standing| standing.window);
        vec![
            self.member.clone(),
            self.standing
                .map_or_else(dash, |standing| standing.tier.as_str().to_owned()),
            window.map_or_else(dash, |w| rate(w.hard_bounce_rate(), w.hard_bounces)),
            window.map_or_else(dash, |w| rate(w.complaint_rate(), w.complaints)),
            window.map_or_else(dash, |w| w.sends.to_string()),
            format!(
                "{} % / {} %",
                percent_of(self.limits.0.open),
                percent_of(self.limits.1.open)
            ),
            self.ses.as_ref().map_or_else(dash, SesStatus::cell),
        ]
    }
}

/// The SES account of the member named `member`, when it is an SES member.
async fn ses_status(mailer: &Mailer, member: &str) -> Option<SesStatus> {
    let ses = mailer.ses(member)?;
    Some(match ses.account().await {
        Ok(account) => SesStatus {
            enforcement: account.enforcement.as_str().to_owned(),
            sending_enabled: Some(account.sending_enabled),
            production_access: Some(account.production_access),
            error: None,
        },
        Err(error) => SesStatus {
            enforcement: "unknown".to_owned(),
            sending_enabled: None,
            production_access: None,
            error: Some(format!("{}: {}", error.code(), error.message())),
        },
    })
}

async fn row(mailer: &Mailer, breaker: &ReputationBreaker) -> Row {
    let (standing, error) = if mailer.shares_breakers() {
        match breaker.standing().await {
            Ok(standing) => (Some(standing), None),
            Err(error) => (None, Some(error.to_string())),
        }
    } else {
        (None, None)
    };
    let rules = breaker.rules();
    Row {
        member: breaker.member().to_owned(),
        standing,
        limits: (rules.hard_bounces, rules.complaints),
        failover: breaker.fails_over(),
        error,
        ses: ses_status(mailer, breaker.member()).await,
    }
}

pub async fn run(stack: &Stack, out: &Out, args: ReputationArgs) -> Result<Exit, Failure> {
    let mailer = &stack.mailer;
    if mailer.reputations().next().is_none() {
        return Err(Failure::usage(
            "no member has a reputation breaker: give one `reputation.*` keys in the DSN \
             (`reputation.hard_bounces.open=4%25`, ...), or a `reputation` table in the TOML",
        ));
    }
    match args.action {
        None => list(mailer, out).await,
        Some(Action::Reset { name }) => reset(mailer, out, &name).await,
    }
}

async fn list(mailer: &Mailer, out: &Out) -> Result<Exit, Failure> {
    let reading = mailer.reputations().map(|breaker| row(mailer, breaker));
    let rows = futures::future::join_all(reading).await;
    let shared = mailer.shares_breakers();
    show(out, &rows, shared);
    if !shared {
        out.note(
            "the reputation breakers of this configuration live in each process's memory (no \
             Redis store): this process would show its own counts, in this process only, none \
             of the application's. Add `redis=redis://HOST:6379/` to the DSN (or a [redis] \
             table) so that the fleet shares them.",
        );
    }
    let unread: Vec<String> = rows
        .iter()
        .filter_map(|row| Some(format!("{}: {}", row.member, row.error.as_ref()?)))
        .collect();
    if unread.is_empty() {
        return Ok(Exit::Ok);
    }
    // The rows are printed (with `--json`, one document whose rows carry `error`): the
    // failure is a note and the exit code, not a second document.
    out.note(&format!(
        "mail-breaker: the reputation store did not answer for {}",
        unread.join("; ")
    ));
    Ok(Exit::Down)
}

async fn reset(mailer: &Mailer, out: &Out, name: &str) -> Result<Exit, Failure> {
    if !mailer.shares_breakers() {
        return Err(Failure::usage(
            "the reputation breakers of this configuration live in each process's memory (no \
             Redis store): a reset here would reach this process only, not the application. \
             Add `redis=redis://HOST:6379/` to the DSN (or a [redis] table) so that the fleet \
             shares them.",
        ));
    }
    let Some(breaker) = mailer.reputation(name) else {
        let names: Vec<&str> = mailer
            .reputations()
            .map(ReputationBreaker::member)
            .collect();
        return Err(Failure::usage(format!(
            "no member named {name:?} has a reputation breaker; those with one are: {}",
            names.join(", ")
        )));
    };
    breaker.reset().await.map_err(|error| {
        Failure::new(
            Exit::Down,
            format!(
                "{name}: the reputation store did not take the reset ({error}); the breaker \
                 is as it was. Check the redis setting and try again."
            ),
        )
    })?;
    let row = row(mailer, breaker).await;
    if out.json {
        out.json(&json!({ "action": "reset", "reputation": row.json() }));
    } else {
        out.line(&format!(
            "{name}: reputation reset (closed, counts cleared) for every process sharing the store"
        ));
        show(out, &[row], true);
    }
    Ok(Exit::Ok)
}

fn show(out: &Out, rows: &[Row], shared: bool) {
    if out.json {
        out.json(&json!({
            "shared": shared,
            "reputation": rows.iter().map(Row::json).collect::<Vec<Value>>(),
        }));
        return;
    }
    out.table(
        &[
            "member",
            "tier",
            "hard bounces",
            "complaints",
            "sends",
            "opens at",
            "ses account",
        ],
        rows.iter().map(Row::cells).collect(),
    );
}
