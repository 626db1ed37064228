//! `mail-breaker outbox stats|dead|show ID|requeue ID|requeue --all|purge ID|drain`: the
//! outbox read and operated through `Outbox`'s own methods (nothing reads its tables). What
//! a message or an error holds is shown through [`Out`], which escapes its controls.

use std::time::Duration;

use clap::{Args, Subcommand};
use indicatif::{ProgressBar, ProgressStyle};
use mail_breaker::outbox::{Outbox, OutboxId, StoredMessage};
use mail_breaker::{OutboxStats, SendError};
use serde_json::{Value, json};

use crate::exit::{Exit, Failure};
use crate::output::{Out, age, human_duration, rfc3339};
use crate::stack::Stack;

#[derive(Debug, Args)]
pub struct OutboxArgs {
    #[command(subcommand)]
    action: Action,
}

#[derive(Debug, Subcommand)]
enum Action {
    /// What the outbox holds: queued, due, leased, dead, the oldest message's age.
    Stats,
    /// The dead letters, those dead longest first, each with its last error.
    Dead {
        /// At most this many.
        #[arg(long, default_value_t = 100)]
        limit: u32,
    },
    /// One message: its envelope, headers, attempts and last error.
    Show {
        /// Its id in the outbox (as `dead` lists it).
        id: i64,
        /// Print the message itself, byte for byte, instead (on a terminal, each line with
        /// its control characters escaped).
        #[arg(long)]
        raw: bool,
    },
    /// Make a dead letter due again now (its attempts and last error kept).
    Requeue {
        /// The dead letter's id.
        #[arg(required_unless_present = "all", conflicts_with = "all")]
        id: Option<i64>,
        /// Every dead letter.
        #[arg(long)]
        all: bool,
    },
    /// Delete a dead letter for good (with --queued, mail still waiting to be sent too).
    Purge {
        /// Its id.
        id: i64,
        /// Delete the message even if it is queued (or being sent) rather than dead.
        #[arg(long)]
        queued: bool,
    },
    /// Send what is due now through the stack, in the foreground, until nothing is due
    /// (or Ctrl-C), as `postqueue -f` flushes Postfix's queue.
    Drain,
}

pub async fn run(stack: &Stack, out: &Out, args: OutboxArgs) -> Result<Exit, Failure> {
    let outbox = stack.outbox()?;
    match args.action {
        Action::Stats => stats(outbox, out).await,
        Action::Dead { limit } => dead(outbox, out, limit).await,
        Action::Show { id, raw } => show(outbox, out, OutboxId::from(id), raw).await,
        Action::Requeue { id: Some(id), .. } => requeue(outbox, out, OutboxId::from(id)).await,
        Action::Requeue { id: None, .. } => requeue_all(outbox, out).await,
        Action::Purge { id, queued } => purge(outbox, out, OutboxId::from(id), queued).await,
        Action::Drain => drain(stack, outbox, out).await,
    }
}

fn reading(error: SendError) -> Failure {
    Failure::send("the outbox's database", &error)
}

fn stats_json(stats: &OutboxStats) -> Value {
    json!({
        "queued": stats.queued,
        "due": stats.due,
        "leased": stats.leased,
        "dead": stats.dead,
        "oldest_seconds": stats.oldest.map(|oldest| oldest.as_secs_f64()),
    })
}

async fn stats(outbox: &Outbox, out: &Out) -> Result<Exit, Failure> {
    let stats = outbox.stats().await.map_err(reading)?;
    if out.json {
        out.json(&stats_json(&stats));
    } else {
        out.table(
            &["queued", "due", "leased", "dead", "oldest"],
            vec![vec![
                stats.queued.to_string(),
                stats.due.to_string(),
                stats.leased.to_string(),
                stats.dead.to_string(),
                stats
                    .oldest
                    .map(human_duration)
                    .unwrap_or_else(|| "-".into()),
            ]],
        );
    }
    Ok(Exit::Ok)
}

/// A subject for people: decoded (RFC 2047) when it can be.
fn subject(message: &StoredMessage) -> Option<String> {
    mail_parser::MessageParser::default()
        .parse_headers(&message.raw)
        .and_then(|parsed| parsed.subject().map(str::to_owned))
        .or_else(|| message.subject())
}

fn recipients(envelope: &mail_breaker::Envelope) -> String {
    envelope
        .to()
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(", ")
}

async fn dead(outbox: &Outbox, out: &Out, limit: u32) -> Result<Exit, Failure> {
    let letters = outbox.dead_letters(limit).await.map_err(reading)?;
    let mut rows = Vec::with_capacity(letters.len());
    for letter in &letters {
        let message = outbox.message(letter.id).await.map_err(reading)?;
        rows.push((letter, message.as_ref().and_then(subject)));
    }
    if out.json {
        out.json(&json!({
            "dead": rows.iter().map(|(letter, subject)| json!({
                "id": i64::from(letter.id),
                "sender": letter.envelope.from().map(ToString::to_string),
                "recipients": letter.envelope.to().iter().map(ToString::to_string).collect::<Vec<_>>(),
                "subject": subject,
                "attempts": letter.attempts,
                "dead_at": rfc3339(letter.at),
                "error": error_json(&letter.error),
            })).collect::<Vec<Value>>(),
        }));
        return Ok(Exit::Ok);
    }
    if rows.is_empty() {
        out.line("no dead letters");
        return Ok(Exit::Ok);
    }
    out.table(
        &[
            "id",
            "recipients",
            "subject",
            "attempts",
            "died",
            "code",
            "error",
        ],
        rows.iter()
            .map(|(letter, subject)| {
                vec![
                    letter.id.to_string(),
                    recipients(&letter.envelope),
                    subject.clone().unwrap_or_default(),
                    letter.attempts.to_string(),
                    format!("{} ago", human_duration(age(letter.at))),
                    letter.error.code().to_owned(),
                    letter.error.message().to_owned(),
                ]
            })
            .collect(),
    );
    Ok(Exit::Ok)
}

fn error_json(error: &SendError) -> Value {
    json!({
        "code": error.code(),
        "category": error.category().as_str(),
        "message": error.message(),
        "transport": error.transport(),
    })
}

async fn show(outbox: &Outbox, out: &Out, id: OutboxId, raw: bool) -> Result<Exit, Failure> {
    let Some(message) = outbox.message(id).await.map_err(reading)? else {
        return Err(Failure::usage(format!(
            "the outbox holds no message {id} (sent, purged, or never there)"
        )));
    };
    if raw {
        out.raw(&message.raw);
        return Ok(Exit::Ok);
    }
    let status = if message.is_dead() {
        "dead"
    } else if message.leased {
        "leased"
    } else {
        "queued"
    };
    if out.json {
        out.json(&json!({
            "id": i64::from(message.id),
            "status": status,
            "sender": message.envelope.from().map(ToString::to_string),
            "recipients": message.envelope.to().iter().map(ToString::to_string).collect::<Vec<_>>(),
            "subject": subject(&message),
            "attempts": message.attempts,
            "enqueued_at": rfc3339(message.enqueued_at),
            "due_at": (!message.is_dead()).then(|| rfc3339(message.due_at)),
            "dead_at": message.dead_at.map(rfc3339),
            "error": message.error.as_ref().map(error_json),
            "headers": message.headers().into_iter().map(|(name, value)| json!([name, value])).collect::<Vec<Value>>(),
            "size": message.raw.len(),
        }));
        return Ok(Exit::Ok);
    }
    let mut rows = vec![
        vec!["id".to_owned(), message.id.to_string()],
        vec!["status".to_owned(), status.to_owned()],
        vec![
            "from".to_owned(),
            message
                .envelope
                .from()
                .map_or_else(|| "<>".to_owned(), ToString::to_string),
        ],
        vec!["to".to_owned(), recipients(&message.envelope)],
        vec!["subject".to_owned(), subject(&message).unwrap_or_default()],
        vec!["attempts".to_owned(), message.attempts.to_string()],
        vec![
            "queued".to_owned(),
            format!(
                "{} ({} ago)",
                rfc3339(message.enqueued_at),
                human_duration(age(message.enqueued_at))
            ),
        ],
    ];
    match message.dead_at {
        Some(dead_at) => rows.push(vec!["died".to_owned(), rfc3339(dead_at)]),
        None => rows.push(vec!["due".to_owned(), rfc3339(message.due_at)]),
    }
    if let Some(error) = &message.error {
        rows.push(vec!["last error".to_owned(), error.to_string()]);
    }
    rows.push(vec![
        "size".to_owned(),
        format!("{} bytes", message.raw.len()),
    ]);
    out.table(&["", ""], rows);
    out.line("");
    out.table(
        &["header", "value"],
        message
            .headers()
            .into_iter()
            .map(|(name, value)| vec![name, value])
            .collect(),
    );
    Ok(Exit::Ok)
}

async fn requeue(outbox: &Outbox, out: &Out, id: OutboxId) -> Result<Exit, Failure> {
    if !outbox.requeue(id).await.map_err(reading)? {
        return Err(Failure::usage(format!(
            "{id} is not a dead letter (see `outbox dead`)"
        )));
    }
    if out.json {
        out.json(&json!({ "requeued": [i64::from(id)] }));
    } else {
        out.line(&format!("{id} requeued: due now"));
    }
    Ok(Exit::Ok)
}

/// How many dead letters `requeue --all` reads at a time: memory stays bounded however many
/// there are.
const REQUEUE_BATCH: u32 = 500;

/// The progress bar of `requeue --all` over `total` dead letters (on stderr, drawn only on a
/// terminal); none under `--json`, whose reader is a script.
fn requeue_bar(json: bool, total: u64) -> ProgressBar {
    if json {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::new(total);
    if let Ok(style) = ProgressStyle::with_template("{bar:40} {pos}/{len} requeued ({eta})") {
        bar.set_style(style);
    }
    bar
}

/// Requeues every dead letter, a page of [`REQUEUE_BATCH`] at a time, newest first, with a
/// progress bar. Each letter is requeued in a statement of its own, so that an error stops
/// the walk with everything before it done: the command then says how many it requeued (in
/// `--json` too) and exits with the error's code. Running it again requeues the rest.
///
/// Dead letters of suppressed recipients ([`DeadLetter::is_suppressed`](mail_breaker::outbox::DeadLetter::is_suppressed)) are left dead and
/// named (`skipped_suppressed`): sending them again would be refused again, and an address
/// taken off the list is a person's decision, one letter at a time (`requeue ID`).
async fn requeue_all(outbox: &Outbox, out: &Out) -> Result<Exit, Failure> {
    let mut requeued: Vec<i64> = Vec::new();
    let mut skipped: Vec<i64> = Vec::new();
    let mut bar = ProgressBar::hidden();
    let stopped = 'walk: {
        match outbox.stats().await {
            Ok(stats) => bar = requeue_bar(out.json, stats.dead),
            Err(error) => break 'walk Some(error),
        }
        // The cursor, not the first page again: a letter that dies again while the walk
        // runs is not requeued twice, and the walk ends.
        let mut before = None;
        loop {
            let page = match outbox.dead_letters_page(before, REQUEUE_BATCH).await {
                Ok(page) => page,
                Err(error) => break 'walk Some(error),
            };
            let Some(last) = page.last() else {
                break 'walk None;
            };
            before = Some(last.id);
            for letter in &page {
                if letter.is_suppressed() {
                    skipped.push(i64::from(letter.id));
                    bar.inc(1);
                    continue;
                }
                match outbox.requeue(letter.id).await {
                    Ok(true) => {
                        requeued.push(i64::from(letter.id));
                        bar.inc(1);
                    }
                    // Requeued or purged by someone else since the page was read.
                    Ok(false) => {}
                    Err(error) => break 'walk Some(error),
                }
            }
        }
    };
    bar.finish_and_clear();
    let count = requeued.len();
    let done = format!(
        "{count} dead letter{} requeued",
        if count == 1 { "" } else { "s" }
    );
    let left = if skipped.is_empty() {
        String::new()
    } else {
        format!(
            "; {} left dead: {} recipients are suppressed",
            skipped.len(),
            if skipped.len() == 1 { "its" } else { "their" }
        )
    };
    let Some(error) = stopped else {
        if out.json {
            out.json(&json!({
                "requeued": requeued,
                "count": count,
                "skipped_suppressed": skipped,
            }));
        } else {
            out.line(&format!("{done}: due now{left}"));
        }
        return Ok(Exit::Ok);
    };
    let failure = reading(error);
    if out.json {
        out.json(&json!({
            "requeued": requeued,
            "count": count,
            "skipped_suppressed": skipped,
            "error": {
                "message": failure.message,
                "setting": failure.setting,
                "exit_code": failure.code as u8,
            },
        }));
    } else {
        out.line(&format!("{done} before an error: due now{left}"));
        out.note(&format!(
            "mail-breaker: {}; the rest are still dead: `outbox requeue --all` again \
             requeues them",
            failure.message
        ));
    }
    Ok(failure.code)
}

/// Deletes a dead letter, or with `queued` any message. Without it a message requeued since
/// the operator read it dead is kept: the delete checks in the same statement.
async fn purge(outbox: &Outbox, out: &Out, id: OutboxId, queued: bool) -> Result<Exit, Failure> {
    let purged = if queued {
        outbox.purge(id).await
    } else {
        outbox.purge_dead(id).await
    };
    if !purged.map_err(reading)? {
        let there = !queued && outbox.message(id).await.map_err(reading)?.is_some();
        return Err(Failure::usage(if there {
            format!(
                "{id} is not a dead letter: it is waiting to be sent; give --queued to delete \
                 it all the same"
            )
        } else {
            format!("the outbox holds no message {id}")
        }));
    }
    if out.json {
        out.json(&json!({ "purged": [i64::from(id)] }));
    } else {
        out.line(&format!("{id} purged"));
    }
    Ok(Exit::Ok)
}

async fn drain(stack: &Stack, outbox: &Outbox, out: &Out) -> Result<Exit, Failure> {
    let Some(worker) = stack.mailer.worker() else {
        return Err(Failure::usage("the configuration has no outbox"));
    };
    let before = outbox.stats().await.map_err(reading)?;
    let bar = ProgressBar::new(before.queued);
    if let Ok(style) = ProgressStyle::with_template("{bar:40} {pos}/{len} left the queue ({eta})") {
        bar.set_style(style);
    }
    let watching = {
        let outbox = outbox.clone();
        let bar = bar.clone();
        let start = before.queued;
        async move {
            loop {
                tokio::time::sleep(Duration::from_millis(200)).await;
                if let Ok(now) = outbox.stats().await {
                    // Sent or dead since the start: what left the queue.
                    bar.set_position(start.saturating_sub(now.queued));
                }
            }
        }
    };
    let interrupted = tokio::select! {
        drained = worker.drain() => { drained.map_err(|e| Failure::send("the drain stopped", &e))?; false }
        _ = tokio::signal::ctrl_c() => true,
        _ = watching => false,
    };
    bar.finish_and_clear();
    let after = outbox.stats().await.map_err(reading)?;
    let left_queue = before.queued.saturating_sub(after.queued);
    let died = after.dead.saturating_sub(before.dead);
    let sent = left_queue.saturating_sub(died);
    let code = if interrupted {
        Exit::Other
    } else if after.queued > 0 {
        Exit::Down
    } else {
        Exit::Ok
    };
    if out.json {
        out.json(&json!({
            "interrupted": interrupted,
            "sent": sent,
            "dead": died,
            "before": stats_json(&before),
            "after": stats_json(&after),
            "exit_code": code as u8,
        }));
        return Ok(code);
    }
    if interrupted {
        out.note(
            "interrupted: messages in flight are due again when their lease runs out \
             (at least once: a provider may get one twice)",
        );
    }
    out.line(&format!(
        "{sent} sent, {died} dead; {} still queued ({} due), {} dead in all",
        after.queued, after.due, after.dead
    ));
    if after.queued > 0 && !interrupted {
        out.note(
            "what is still queued failed for now and is due later: see `outbox stats`, and \
             `check` for the providers",
        );
    }
    Ok(code)
}

#[cfg(test)]
mod tests {
    use super::requeue_bar;

    #[test]
    fn requeue_all_counts_toward_every_dead_letter_on_its_bar_and_shows_none_for_a_script() {
        assert_eq!(requeue_bar(false, 1_200).length(), Some(1_200));
        assert_eq!(requeue_bar(true, 1_200).length(), None);
    }
}
