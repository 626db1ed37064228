//! `mail-breaker send FILE.eml... | -`: raw messages through the stack, each as it is. The
//! envelope comes from the headers (`From`; `To`, `Cc` and `Bcc`) unless `--from`/`--to` say
//! otherwise. A progress bar on more than one message, then a summary (sent, queued,
//! refused, failed) and a row per failure; with `--json`, one JSON line per message and a
//! last line with the summary.

use std::path::PathBuf;
use std::str::FromStr;

use clap::Args;
use futures::StreamExt;
use indicatif::{ProgressBar, ProgressStyle};
use lettre::Address;
use mail_breaker::{Category, Envelope, Receipt, SendError, Transport};
use serde_json::json;

use crate::exit::{Exit, Failure};
use crate::output::Out;
use crate::stack::Stack;

#[derive(Debug, Args)]
pub struct SendArgs {
    /// The messages: .eml files (RFC 5322, headers and body), or `-` for one on stdin.
    #[arg(required = true, value_name = "FILE.eml")]
    files: Vec<PathBuf>,
    /// The envelope's sender, instead of the message's `From`.
    #[arg(long, value_name = "ADDR")]
    from: Option<String>,
    /// The envelope's recipients, instead of the message's `To`, `Cc` and `Bcc` (repeat it).
    #[arg(long, value_name = "ADDR")]
    to: Vec<String>,
    /// Messages in flight at once.
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u16).range(1..))]
    concurrency: u16,
}

/// How one message ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Outcome {
    Sent,
    Queued,
    Refused,
    Failed,
}

impl Outcome {
    fn word(self) -> &'static str {
        match self {
            Outcome::Sent => "sent",
            Outcome::Queued => "queued",
            Outcome::Refused => "refused",
            Outcome::Failed => "failed",
        }
    }
}

struct Answer {
    file: String,
    outcome: Outcome,
    result: Result<Receipt, SendError>,
}

pub async fn run(stack: &Stack, out: &Out, args: SendArgs) -> Result<Exit, Failure> {
    let from = args
        .from
        .as_deref()
        .map(|text| address("--from", text))
        .transpose()?;
    let to = args
        .to
        .iter()
        .map(|text| address("--to", text))
        .collect::<Result<Vec<_>, _>>()?;
    if args.files.iter().filter(|file| is_stdin(file)).count() > 1 {
        return Err(Failure::usage("`-` (stdin) can be given once"));
    }
    let total = args.files.len();
    let bar = if shows_a_bar(total) {
        let bar = ProgressBar::new(total as u64);
        if let Ok(style) =
            ProgressStyle::with_template("{bar:40} {pos}/{len} sent or queued {msg} ({eta})")
        {
            bar.set_style(style);
        }
        bar
    } else {
        ProgressBar::hidden()
    };
    let mailer = &stack.mailer;
    let sends = futures::stream::iter(args.files.iter())
        .map(|file| {
            let from = from.clone();
            let to = to.clone();
            async move {
                let name = file.display().to_string();
                let result = match read(file).await {
                    Ok(raw) => match envelope(&raw, from, to) {
                        Ok(envelope) => mailer.send_raw(&envelope, &raw).await,
                        Err(error) => Err(error),
                    },
                    Err(error) => Err(error),
                };
                let outcome = match &result {
                    Ok(receipt) if receipt.is_queued() => Outcome::Queued,
                    Ok(_) => Outcome::Sent,
                    Err(error) if Exit::of(error) == Exit::Refused => Outcome::Refused,
                    Err(_) => Outcome::Failed,
                };
                Answer {
                    file: name,
                    outcome,
                    result,
                }
            }
        })
        .buffer_unordered(usize::from(args.concurrency));
    futures::pin_mut!(sends);
    let mut answers = Vec::with_capacity(total);
    while let Some(answer) = sends.next().await {
        bar.inc(1);
        if out.json {
            bar.suspend(|| out.json(&line(&answer)));
        }
        answers.push(answer);
    }
    bar.finish_and_clear();

    let count = |outcome| answers.iter().filter(|a| a.outcome == outcome).count();
    let (sent, queued, refused, failed) = (
        count(Outcome::Sent),
        count(Outcome::Queued),
        count(Outcome::Refused),
        count(Outcome::Failed),
    );
    let code = Exit::combined(answers.iter().map(|answer| match &answer.result {
        Ok(_) => Exit::Ok,
        Err(error) => Exit::of(error),
    }));
    if out.json {
        out.json(&json!({
            "type": "summary",
            "total": total,
            "sent": sent,
            "queued": queued,
            "refused": refused,
            "failed": failed,
            "exit_code": code as u8,
        }));
        return Ok(code);
    }
    if total == 1
        && let Some(Answer {
            result: Ok(receipt),
            ..
        }) = answers.first()
    {
        out.line(&match receipt.is_queued() {
            true => format!(
                "queued in the outbox as {}",
                receipt.message_id().unwrap_or("?")
            ),
            false => format!(
                "sent by {} as {}",
                receipt.transport(),
                receipt.message_id().unwrap_or("?")
            ),
        });
    }
    out.line(&format!(
        "{total} message{}: {sent} sent, {queued} queued, {refused} refused, {failed} failed",
        if total == 1 { "" } else { "s" }
    ));
    let failures: Vec<Vec<String>> = answers
        .iter()
        .filter_map(|answer| {
            let error = answer.result.as_ref().err()?;
            Some(vec![
                answer.file.clone(),
                answer.outcome.word().to_owned(),
                error.code().to_owned(),
                error.to_string(),
            ])
        })
        .collect();
    if !failures.is_empty() {
        out.line("");
        out.table(&["file", "outcome", "code", "error"], failures);
    }
    Ok(code)
}

fn line(answer: &Answer) -> serde_json::Value {
    match &answer.result {
        Ok(receipt) => json!({
            "type": "message",
            "file": answer.file,
            "outcome": answer.outcome.word(),
            "transport": receipt.transport(),
            "message_id": receipt.message_id(),
            "response": receipt.response(),
            "attempts": receipt.attempts(),
        }),
        Err(error) => json!({
            "type": "message",
            "file": answer.file,
            "outcome": answer.outcome.word(),
            "transport": error.transport(),
            "code": error.code(),
            "category": error.category().as_str(),
            "error": error.to_string(),
        }),
    }
}

/// A progress bar for more than one message (drawn only on a terminal).
fn shows_a_bar(messages: usize) -> bool {
    messages > 1
}

fn is_stdin(file: &std::path::Path) -> bool {
    file.as_os_str() == "-"
}

async fn read(file: &std::path::Path) -> Result<Vec<u8>, SendError> {
    let read = if is_stdin(file) {
        use tokio::io::AsyncReadExt;
        let mut raw = Vec::new();
        tokio::io::stdin().read_to_end(&mut raw).await.map(|_| raw)
    } else {
        tokio::fs::read(file).await
    };
    read.map_err(|error| {
        SendError::new(
            Category::InvalidMessage,
            "cli.unreadable",
            format!("cannot read {}: {error}", file.display()),
        )
    })
}

fn address(flag: &str, text: &str) -> Result<Address, Failure> {
    Address::from_str(text)
        .map_err(|error| Failure::usage(format!("{flag} {text:?} is not an address: {error}")))
}

/// The envelope of a raw message: `from` or its `From` (else `Sender`), and `to` or its
/// `To`, `Cc` and `Bcc`.
fn envelope(raw: &[u8], from: Option<Address>, to: Vec<Address>) -> Result<Envelope, SendError> {
    let bad = |why: String| SendError::new(Category::InvalidMessage, "cli.bad_message", why);
    let parsed = mail_parser::MessageParser::default()
        .parse(raw)
        .ok_or_else(|| bad("not a message: no header could be read".to_owned()))?;
    let addresses = |list: Option<&mail_parser::Address<'_>>| -> Vec<String> {
        list.map(|list| {
            list.iter()
                .filter_map(|addr| addr.address().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default()
    };
    let from = match from {
        Some(from) => Some(from),
        None => addresses(parsed.from())
            .into_iter()
            .chain(addresses(parsed.sender()))
            .next()
            .map(|text| Address::from_str(&text).map_err(|e| bad(format!("From {text:?}: {e}"))))
            .transpose()?,
    };
    let to = if to.is_empty() {
        let mut all = addresses(parsed.to());
        all.extend(addresses(parsed.cc()));
        all.extend(addresses(parsed.bcc()));
        all.iter()
            .map(|text| {
                Address::from_str(text).map_err(|e| bad(format!("recipient {text:?}: {e}")))
            })
            .collect::<Result<Vec<_>, _>>()?
    } else {
        to
    };
    if to.is_empty() {
        return Err(bad(
            "no recipient: the message has no To, Cc or Bcc (or give --to)".to_owned(),
        ));
    }
    Envelope::new(from, to).map_err(|error| bad(error.to_string()))
}

#[cfg(test)]
mod tests {
    use mail_breaker::{Category, Receipt, SendError};

    use super::{Answer, Outcome, address, envelope, is_stdin, line, shows_a_bar};
    use crate::exit::Exit;

    const RAW: &[u8] = b"From: App <app@example.com>\r\nTo: a@example.org\r\n\
        Cc: b@example.org\r\nBcc: c@example.org\r\nSubject: hi\r\n\r\nbody\r\n";

    fn addresses(envelope: &mail_breaker::Envelope) -> Vec<String> {
        envelope.to().iter().map(ToString::to_string).collect()
    }

    #[test]
    fn each_outcome_is_written_as_its_word() {
        let words = [
            Outcome::Sent,
            Outcome::Queued,
            Outcome::Refused,
            Outcome::Failed,
        ]
        .map(Outcome::word);
        assert_eq!(words, ["sent", "queued", "refused", "failed"]);
    }

    #[test]
    fn the_envelope_is_the_messages_from_and_its_to_cc_and_bcc() {
        let envelope = envelope(RAW, None, Vec::new()).unwrap();
        assert_eq!(
            envelope.from().map(ToString::to_string).as_deref(),
            Some("app@example.com")
        );
        assert_eq!(
            addresses(&envelope),
            ["a@example.org", "b@example.org", "c@example.org"]
        );
    }

    #[test]
    fn without_a_from_the_sender_is_the_envelopes_sender() {
        let raw = b"Sender: ops@example.com\r\nTo: a@example.org\r\n\r\nbody\r\n";
        let envelope = envelope(raw, None, Vec::new()).unwrap();
        assert_eq!(
            envelope.from().map(ToString::to_string).as_deref(),
            Some("ops@example.com")
        );
    }

    #[test]
    fn from_and_to_given_on_the_command_line_replace_the_headers() {
        let from = address("--from", "bounce@example.com").unwrap();
        let to = vec![address("--to", "only@example.net").unwrap()];
        let envelope = envelope(RAW, Some(from), to).unwrap();
        assert_eq!(
            envelope.from().map(ToString::to_string).as_deref(),
            Some("bounce@example.com")
        );
        assert_eq!(addresses(&envelope), ["only@example.net"]);
    }

    #[test]
    fn a_message_without_a_recipient_is_an_invalid_message() {
        let raw = b"From: app@example.com\r\nSubject: hi\r\n\r\nbody\r\n";
        let error = envelope(raw, None, Vec::new()).unwrap_err();
        assert_eq!(error.category(), Category::InvalidMessage);
        assert_eq!(error.code(), "cli.bad_message");
    }

    #[test]
    fn an_address_flag_that_is_not_an_address_is_a_usage_error_naming_the_flag() {
        let failure = address("--to", "not an address").unwrap_err();
        assert_eq!(failure.code, Exit::Usage);
        assert!(failure.message.starts_with("--to "), "{}", failure.message);
    }

    #[test]
    fn a_progress_bar_is_shown_for_more_than_one_message() {
        assert!(!shows_a_bar(0));
        assert!(!shows_a_bar(1));
        assert!(shows_a_bar(2));
    }

    #[test]
    fn only_a_lone_dash_is_stdin() {
        assert!(is_stdin(std::path::Path::new("-")));
        assert!(!is_stdin(std::path::Path::new("-.eml")));
    }

    #[test]
    fn each_messages_json_line_says_how_it_ended_and_through_what() {
        let sent = line(&Answer {
            file: "a.eml".to_owned(),
            outcome: Outcome::Sent,
            result: Ok(Receipt::new("smtp://relay:587")),
        });
        assert_eq!(sent["type"], "message");
        assert_eq!(sent["file"], "a.eml");
        assert_eq!(sent["outcome"], "sent");
        assert_eq!(sent["transport"], "smtp://relay:587");
        let refused = line(&Answer {
            file: "b.eml".to_owned(),
            outcome: Outcome::Refused,
            result: Err(SendError::new(
                Category::Rejected,
                "smtp.550",
                "5.1.1 no such user",
            )),
        });
        assert_eq!(refused["outcome"], "refused");
        assert_eq!(refused["code"], "smtp.550");
        assert_eq!(refused["category"], "rejected");
    }
}
