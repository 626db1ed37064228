//! `mail-breaker breakers [isolate NAME | reset NAME]`: the members' breakers as the shared
//! store (Redis) holds them, and isolating or resetting one for every process of the fleet.
//!
//! On the in-memory store a new process has breakers of its own, which tell nothing of the
//! application's and reach no other process: the command says so and exits 2 rather than
//! show a fresh, closed breaker or pretend to isolate.

use clap::{Args, Subcommand};
use mail_breaker::config::Mailer;
use mail_breaker::{Reach, Snapshot, State};
use serde_json::{Value, json};

use crate::exit::{Exit, Failure};
use crate::output::{Out, human_duration};
use crate::stack::Stack;

#[derive(Debug, Args)]
#[command(args_conflicts_with_subcommands = true)]
pub struct BreakersArgs {
    #[command(subcommand)]
    action: Option<Action>,
}

#[derive(Debug, Subcommand)]
enum Action {
    /// Hold a member's breaker open until `reset`: every process sharing the store fails
    /// over past it (sends answered `breaker.isolated`), and no probe goes.
    Isolate {
        /// The member's name (its `name` setting, or its provider's name as `breakers` lists it).
        name: String,
    },
    /// Close a member's breaker, clear its counts and lift an isolation, for every process.
    Reset {
        /// The member's name.
        name: String,
    },
}

/// A member's breaker as the command shows it.
pub struct Row {
    pub member: String,
    /// `closed`, `open`, `half-open` or `isolated`.
    pub state: String,
    pub failures: u32,
    pub calls: u32,
    pub retry_after: Option<std::time::Duration>,
    pub open_streak: u32,
}

impl Row {
    fn of(member: &str, snapshot: &Snapshot) -> Row {
        Row {
            member: member.to_owned(),
            state: state_word(snapshot),
            failures: snapshot.failures(),
            calls: snapshot.calls(),
            retry_after: snapshot.retry_after(),
            open_streak: snapshot.open_streak(),
        }
    }

    fn json(&self) -> Value {
        json!({
            "member": self.member,
            "state": self.state,
            "failures": self.failures,
            "calls": self.calls,
            "retry_after_ms": self.retry_after.map(|after| after.as_millis() as u64),
            "open_streak": self.open_streak,
        })
    }
}

fn state_word(snapshot: &Snapshot) -> String {
    if snapshot.is_isolated() {
        return "isolated".to_owned();
    }
    match snapshot.state() {
        State::Closed => "closed",
        State::Open => "open",
        State::HalfOpen => "half-open",
    }
    .to_owned()
}

/// Each member's breaker (under `Scope::Transport`), in the configuration's order.
pub async fn states(mailer: &Mailer) -> Vec<Row> {
    let mut rows = Vec::new();
    for (name, breaker) in mailer.breakers() {
        rows.push(Row::of(name, &breaker.snapshot().await));
    }
    rows
}

pub async fn run(stack: &Stack, out: &Out, args: BreakersArgs) -> Result<Exit, Failure> {
    let mailer = &stack.mailer;
    if !mailer.shares_breakers() {
        return Err(Failure::usage(
            "the breakers of this configuration live in each process's memory (no Redis \
             store): this command would see and change its own, in this process only, \
             reaching no other process. Add `redis=redis://HOST:6379/` to the DSN (or a [redis] table) so that \
             the fleet shares them.",
        ));
    }
    let (name, isolate) = match args.action {
        None => {
            let rows = states(mailer).await;
            show(out, &rows);
            return Ok(Exit::Ok);
        }
        Some(Action::Isolate { name }) => (name, true),
        Some(Action::Reset { name }) => (name, false),
    };
    let Some(breaker) = mailer.breaker(&name) else {
        let names: Vec<&str> = mailer.breakers().map(|(name, _)| name).collect();
        return Err(Failure::usage(format!(
            "no member named {name:?}; the members are: {}",
            names.join(", ")
        )));
    };
    let reached = if isolate {
        breaker.try_isolate().await
    } else {
        breaker.try_reset().await
    };
    let reach = match reached {
        Ok(reach) => reach,
        Err(error) => {
            return Err(Failure::new(
                Exit::Down,
                format!(
                    "{name}: {} This process now exits, so the change is gone with it. Check \
                     the redis setting and try again.",
                    error.message()
                ),
            ));
        }
    };
    let row = Row::of(&name, &breaker.snapshot().await);
    if out.json {
        out.json(&json!({
            "action": if isolate { "isolate" } else { "reset" },
            "reach": match reach {
                Reach::Fleet => "fleet",
                Reach::ThisProcess => "this_process",
            },
            "breaker": row.json(),
        }));
    } else {
        out.line(&format!(
            "{name}: {} for {reach}",
            if isolate {
                "isolated (held open until `breakers reset`)"
            } else {
                "reset (closed, counts cleared)"
            }
        ));
        show(out, &[row]);
    }
    Ok(Exit::Ok)
}

fn show(out: &Out, rows: &[Row]) {
    if out.json {
        out.json(&json!({ "breakers": rows.iter().map(Row::json).collect::<Vec<Value>>() }));
        return;
    }
    out.table(
        &[
            "member",
            "state",
            "failures",
            "calls",
            "probe in",
            "open streak",
        ],
        rows.iter()
            .map(|row| {
                vec![
                    row.member.clone(),
                    row.state.clone(),
                    row.failures.to_string(),
                    row.calls.to_string(),
                    row.retry_after.map(human_duration).unwrap_or_default(),
                    row.open_streak.to_string(),
                ]
            })
            .collect(),
    );
}
