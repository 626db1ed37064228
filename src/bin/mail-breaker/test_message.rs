//! `mail-breaker test --to ADDR`: one message through the whole stack, and its trace as the
//! demo prints it: each member tried and its answer, the breakers' changes, the retry's
//! waits, the breakers' states before and after, the answer and the time taken.

use std::time::Instant;

use clap::Args;
use mail_breaker::{Message, Transport};
use serde_json::{Value, json};

use crate::exit::{Exit, Failure};
use crate::output::{Out, human_duration};
use crate::stack::Stack;
use crate::trace::{Recorded, Recorder};

#[derive(Debug, Args)]
pub struct TestArgs {
    /// The recipient.
    #[arg(long, value_name = "ADDR")]
    to: String,
    /// The sender (default: the recipient, which most relays take from a user allowed to
    /// send as it).
    #[arg(long, value_name = "ADDR")]
    from: Option<String>,
    /// The subject (default: "mail-breaker test" and the time).
    #[arg(long, value_name = "TEXT")]
    subject: Option<String>,
}

pub async fn run(
    stack: &Stack,
    out: &Out,
    recorder: &Recorder,
    args: TestArgs,
) -> Result<Exit, Failure> {
    let message = message(&args)?;
    let mailer = &stack.mailer;
    let before = crate::breakers::states(mailer).await;
    recorder.start();
    let started = Instant::now();
    let result = mailer.send(&message).await;
    let elapsed = started.elapsed();
    let events = recorder.take();
    let after = crate::breakers::states(mailer).await;

    let steps: Vec<Step> = events.iter().filter_map(Step::of).collect();
    let code = match &result {
        Ok(_) => Exit::Ok,
        Err(error) => Exit::of(error),
    };
    if out.json {
        let answer = match &result {
            Ok(receipt) => json!({
                "outcome": if receipt.is_queued() { "queued" } else { "delivered" },
                "transport": receipt.transport(),
                "message_id": receipt.message_id(),
                "response": receipt.response(),
                "attempts": receipt.attempts(),
            }),
            Err(error) => json!({
                "outcome": "failed",
                "transport": error.transport(),
                "code": error.code(),
                "category": error.category().as_str(),
                "error": error.to_string(),
                "causes": error.causes().iter().map(|cause| json!({
                    "transport": cause.transport(),
                    "code": cause.code(),
                    "category": cause.category().as_str(),
                    "error": cause.to_string(),
                })).collect::<Vec<Value>>(),
            }),
        };
        out.json(&json!({
            "to": args.to,
            "stack": mailer.name(),
            "answer": answer,
            "millis": elapsed.as_millis() as u64,
            "exit_code": code as u8,
            "trace": steps.iter().map(Step::json).collect::<Vec<Value>>(),
            "breakers": before.iter().zip(&after).map(|(b, a)| json!({
                "member": b.member,
                "before": b.state,
                "after": a.state,
                "failures_after": a.failures,
            })).collect::<Vec<Value>>(),
        }));
        return Ok(code);
    }

    out.line(&format!(
        "test message to {} through {}",
        args.to,
        mailer.name()
    ));
    for step in &steps {
        out.line(&format!("  {:>8.3}s  {}", step.at.as_secs_f64(), step.text));
    }
    let outcome = match &result {
        Ok(receipt) if receipt.is_queued() => format!(
            "queued in the outbox as {} (no member took it now)",
            receipt.message_id().unwrap_or("?")
        ),
        Ok(receipt) => format!(
            "delivered by {} as {} after {} attempt{}{}",
            receipt.transport(),
            receipt.message_id().unwrap_or("?"),
            receipt.attempts(),
            if receipt.attempts() == 1 { "" } else { "s" },
            receipt
                .response()
                .map(|text| format!(": {text}"))
                .unwrap_or_default(),
        ),
        Err(error) => format!("FAILED: {error}"),
    };
    out.line(&format!("  {:>8.3}s  => {outcome}", elapsed.as_secs_f64()));
    if let Err(error) = &result {
        for cause in error.causes() {
            out.line(&format!("              {cause}"));
        }
    }
    let rows = before
        .iter()
        .zip(&after)
        .map(|(b, a)| vec![b.member.clone(), b.state.clone(), a.state.clone()])
        .collect();
    out.line("");
    out.table(&["member", "before", "after"], rows);
    out.line("");
    out.line(&format!(
        "took {}; exit {}",
        human_duration(elapsed),
        code as u8
    ));
    Ok(code)
}

fn message(args: &TestArgs) -> Result<Message, Failure> {
    let address = |flag: &str, text: &str| {
        text.parse::<lettre::message::Mailbox>()
            .map_err(|error| Failure::usage(format!("{flag} {text:?} is not an address: {error}")))
    };
    let to = address("--to", &args.to)?;
    let from = match &args.from {
        Some(from) => address("--from", from)?,
        None => to.clone(),
    };
    let subject = args.subject.clone().unwrap_or_else(|| {
        format!(
            "mail-breaker test {}",
            crate::output::rfc3339(std::time::SystemTime::now())
        )
    });
    Message::builder()
        .from(from)
        .to(to)
        .subject(subject)
        .body(String::from(
            "A test message sent by the `mail-breaker test` command.\r\n",
        ))
        .map_err(|error| Failure::usage(format!("cannot build the test message: {error}")))
}

/// A line of the trace: what the crate logged that tells the message's way.
struct Step {
    at: std::time::Duration,
    event: String,
    text: String,
    fields: Vec<(String, String)>,
}

impl Step {
    fn of(event: &Recorded) -> Option<Step> {
        let field = |name| event.field(name).unwrap_or("?").to_owned();
        let text = match event.name.as_str() {
            "pool.failover" => format!(
                "{}  {}  -> the pool tries the next member",
                field("transport"),
                field("code")
            ),
            "pool.exhausted" => format!("every member of {} failed", field("pool")),
            "breaker.refused" => format!(
                "{}  skipped: its breaker is open (retry after {} ms)",
                field("transport"),
                field("retry_after_ms")
            ),
            "breaker.open" | "breaker.half_open" | "breaker.closed" => format!(
                "breaker {}: {} -> {}",
                field("transport"),
                field("from"),
                field("to")
            ),
            "retry.scheduled" => format!(
                "retry: attempt {} failed ({}); waits {} ms",
                field("attempt"),
                field("code"),
                field("wait_ms")
            ),
            "retry.throttled" => format!("retry: the budget allows no retry ({})", field("code")),
            "retry.out_of_time" => "retry: no time left for another attempt".to_owned(),
            "rate.throttled" => format!("rate limit of {} lowered", field("limiter")),
            "outbox.queued_after_failure" => {
                format!("queued in the outbox after {}", field("code"))
            }
            _ => return None,
        };
        Some(Step {
            at: event.at,
            event: event.name.clone(),
            text,
            fields: event.fields.clone(),
        })
    }

    fn json(&self) -> Value {
        let mut object = serde_json::Map::new();
        object.insert("at_ms".into(), json!(self.at.as_millis() as u64));
        object.insert("event".into(), json!(self.event));
        for (name, value) in &self.fields {
            object.insert(name.clone(), json!(value));
        }
        Value::Object(object)
    }
}
