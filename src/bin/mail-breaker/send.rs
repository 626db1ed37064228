//! `mail-breaker send FILE.eml... | -`: raw messages through the stack. The envelope comes
//! from the headers (`From`; `To`, `Cc` and `Bcc`, or a resent message's `Resent-To`,
//! `Resent-Cc` and `Resent-Bcc`) unless `--from`/`--to` say otherwise; the blind copies' fields
//! never leave (as lettre leaves them out when it formats a message). A progress bar on more
//! than one message, then a summary (sent, queued, refused, failed, partly sent, invalid) and
//! a row per recipient that did not get the message; with `--json`, one JSON line per message
//! and a last line with the summary. The exit code is 0 only when every recipient of every
//! message was delivered or queued (a deferred recipient is queued when the stack has an
//! outbox, which keeps the message for it). The outbox is the application's: a file that
//! does not exist, or is not an outbox, is exit 2 naming `outbox.url`, never a new outbox
//! that no worker would send from.

use std::path::PathBuf;
use std::str::FromStr;

use clap::Args;
use futures::StreamExt;
use indicatif::{ProgressBar, ProgressStyle};
use lettre::Address;
use mail_breaker::{Category, Receipt, SendError, Transport};
use serde_json::{Value, json};

use crate::eml::{envelope, without_blind_copies};
use crate::exit::{Exit, Failure};
use crate::output::Out;
use crate::stack::Stack;

#[derive(Debug, Args)]
pub struct SendArgs {
    /// The messages: .eml files (RFC 5322, headers and body), or `-` for one on stdin. Their
    /// `Bcc:` and `Resent-Bcc:` fields are taken out before they leave.
    #[arg(required = true, value_name = "FILE.eml")]
    files: Vec<PathBuf>,
    /// The envelope's sender, instead of the message's `From` (a resent message's
    /// `Resent-Sender` or `Resent-From`).
    #[arg(long, value_name = "ADDR")]
    from: Option<String>,
    /// The envelope's recipients, instead of the message's `To`, `Cc` and `Bcc` (a resent
    /// message's `Resent-To`, `Resent-Cc` and `Resent-Bcc`). Repeat it.
    #[arg(long, value_name = "ADDR")]
    to: Vec<String>,
    /// Messages in flight at once.
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u16).range(1..))]
    concurrency: u16,
}

/// How one message ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Outcome {
    /// Delivered to every recipient.
    Sent,
    /// Kept in the outbox for every recipient.
    Queued,
    /// Delivered to some recipients, not to others (refused, deferred, maybe delivered).
    Partial,
    /// Refused whole.
    Refused,
    /// Not sent: the provider down, the credentials refused, …
    Failed,
    /// The file could not be read, or is not a message the command can send: nothing left.
    Invalid,
}

impl Outcome {
    fn word(self) -> &'static str {
        match self {
            Outcome::Sent => "sent",
            Outcome::Queued => "queued",
            Outcome::Partial => "partial",
            Outcome::Refused => "refused",
            Outcome::Failed => "failed",
            Outcome::Invalid => "invalid",
        }
    }
}

/// How a recipient did not get a message the provider took for others.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Missed {
    /// Refused for good (a 5xx to its `RCPT TO`).
    Refused,
    /// Refused for now (a 4xx); `queued` when the outbox keeps the message for it.
    Deferred { queued: bool },
    /// The data went out and no answer came: it may have the message; `queued` when the
    /// outbox keeps the message to send it again (at least once).
    MaybeDelivered { queued: bool },
}

impl Missed {
    fn word(self) -> &'static str {
        match self {
            Missed::Refused => "refused",
            Missed::Deferred { queued: false } => "deferred",
            Missed::Deferred { queued: true } => "deferred, queued",
            Missed::MaybeDelivered { queued: false } => "maybe delivered",
            Missed::MaybeDelivered { queued: true } => "maybe delivered, queued",
        }
    }
}

struct Answer {
    file: String,
    result: Result<Receipt, SendError>,
    /// The file could not be read or parsed, so nothing was sent.
    invalid: bool,
}

impl Answer {
    /// The recipients that did not get the message although the provider took it for others:
    /// how, who, and why.
    fn undelivered(&self) -> Vec<(Missed, &Address, &SendError)> {
        let Ok(receipt) = &self.result else {
            return Vec::new();
        };
        // The receipt says whether the outbox keeps its owed recipients to send again.
        let queued = receipt.is_kept_for_later();
        let lists = [
            (Missed::Refused, receipt.rejected_recipients()),
            (Missed::Deferred { queued }, receipt.deferred_recipients()),
            (
                Missed::MaybeDelivered { queued },
                receipt.maybe_delivered_recipients(),
            ),
        ];
        lists
            .into_iter()
            .flat_map(|(how, list)| list.iter().map(move |(to, why)| (how, to, why)))
            .collect()
    }

    fn outcome(&self) -> Outcome {
        match &self.result {
            Err(_) if self.invalid => Outcome::Invalid,
            Err(error) if Exit::of(error) == Exit::Refused => Outcome::Refused,
            Err(_) => Outcome::Failed,
            Ok(receipt) if receipt.is_queued() => Outcome::Queued,
            Ok(_) if !self.undelivered().is_empty() => Outcome::Partial,
            Ok(_) => Outcome::Sent,
        }
    }

    /// Its exit code: 0 only when every recipient got it or it was queued; for a partial
    /// delivery, the decisive code of its recipients' errors.
    fn code(&self) -> Exit {
        match &self.result {
            Err(_) if self.invalid => Exit::Usage,
            Err(error) => Exit::of(error),
            // Queued is a success: the outbox sends it (again, for one maybe delivered).
            Ok(receipt) if receipt.is_queued() => Exit::Ok,
            Ok(_) => Exit::combined(self.undelivered().into_iter().map(
                |(how, _, why)| match how {
                    Missed::Deferred { queued: true } | Missed::MaybeDelivered { queued: true } => {
                        Exit::Ok
                    }
                    _ => Exit::of(why),
                },
            )),
        }
    }
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
                let file_name = file.display().to_string();
                let prepared = match read(file).await {
                    Ok(raw) => envelope(&raw, from, to).map(|envelope| (raw, envelope)),
                    Err(error) => Err(error),
                };
                match prepared {
                    Ok((raw, envelope)) => Answer {
                        file: file_name,
                        result: mailer
                            .send_raw(&envelope, &without_blind_copies(&raw))
                            .await,
                        invalid: false,
                    },
                    Err(error) => Answer {
                        file: file_name,
                        result: Err(error),
                        invalid: true,
                    },
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

    let count = |outcome| answers.iter().filter(|a| a.outcome() == outcome).count();
    let (sent, queued, refused, failed, partial, invalid) = (
        count(Outcome::Sent),
        count(Outcome::Queued),
        count(Outcome::Refused),
        count(Outcome::Failed),
        count(Outcome::Partial),
        count(Outcome::Invalid),
    );
    let code = Exit::combined(answers.iter().map(Answer::code));
    if out.json {
        out.json(&json!({
            "type": "summary",
            "total": total,
            "sent": sent,
            "queued": queued,
            "refused": refused,
            "failed": failed,
            "partial": partial,
            "invalid": invalid,
            "exit_code": code as u8,
        }));
        return Ok(code);
    }
    if total == 1
        && let Some(
            answer @ Answer {
                result: Ok(receipt),
                ..
            },
        ) = answers.first()
    {
        out.line(&where_it_went(receipt, answer.undelivered().len()));
    }
    out.line(&format!(
        "{total} message{}: {sent} sent, {queued} queued, {refused} refused, {failed} failed, \
         {partial} partly sent, {invalid} invalid",
        if total == 1 { "" } else { "s" }
    ));
    let rows = failure_rows(&answers);
    if !rows.is_empty() {
        out.line("");
        out.table(&["file", "recipient", "outcome", "code", "error"], rows);
    }
    Ok(code)
}

/// Where a lone message went: its provider and id, and how many of its recipients got it
/// when some did not.
fn where_it_went(receipt: &Receipt, undelivered: usize) -> String {
    let id = receipt.message_id().unwrap_or("?");
    if receipt.is_queued() {
        return format!("queued in the outbox as {id}");
    }
    let mut text = format!("sent by {} as {id}", receipt.transport());
    if undelivered > 0 {
        text.push_str(&format!(
            ", not to {undelivered} recipient{}",
            if undelivered == 1 { "" } else { "s" }
        ));
    }
    text
}

/// A row per message that failed whole (its recipient `all`) and per recipient that did not
/// get a message the provider took for others.
fn failure_rows(answers: &[Answer]) -> Vec<Vec<String>> {
    let mut rows = Vec::new();
    for answer in answers {
        let outcome = answer.outcome();
        if let Err(error) = &answer.result {
            rows.push(vec![
                answer.file.clone(),
                "all".to_owned(),
                outcome.word().to_owned(),
                error.code().to_owned(),
                error.to_string(),
            ]);
        }
        for (how, to, why) in answer.undelivered() {
            rows.push(vec![
                answer.file.clone(),
                to.to_string(),
                how.word().to_owned(),
                why.code().to_owned(),
                why.to_string(),
            ]);
        }
    }
    rows
}

fn line(answer: &Answer) -> Value {
    match &answer.result {
        Ok(receipt) => {
            let undelivered = answer.undelivered();
            let list = |wanted: fn(Missed) -> bool| {
                undelivered
                    .iter()
                    .filter(|(how, _, _)| wanted(*how))
                    .map(|(how, to, why)| {
                        let mut entry = json!({
                            "recipient": to.to_string(),
                            "code": why.code(),
                            "category": why.category().as_str(),
                            "error": why.to_string(),
                        });
                        if let Missed::Deferred { queued } | Missed::MaybeDelivered { queued } = how
                        {
                            entry["queued"] = json!(queued);
                        }
                        entry
                    })
                    .collect::<Vec<Value>>()
            };
            json!({
                "type": "message",
                "file": answer.file,
                "outcome": answer.outcome().word(),
                "transport": receipt.transport(),
                "message_id": receipt.message_id(),
                "response": receipt.response(),
                "attempts": receipt.attempts(),
                "refused": list(|how| how == Missed::Refused),
                "deferred": list(|how| matches!(how, Missed::Deferred { .. })),
                "maybe_delivered": list(|how| matches!(how, Missed::MaybeDelivered { .. })),
            })
        }
        Err(error) => json!({
            "type": "message",
            "file": answer.file,
            "outcome": answer.outcome().word(),
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

#[cfg(test)]
mod tests {
    use mail_breaker::{Category, Receipt, SendError};

    use super::{
        Answer, Outcome, address, failure_rows, is_stdin, line, shows_a_bar, where_it_went,
    };
    use crate::exit::Exit;

    #[test]
    fn each_outcome_is_written_as_its_word() {
        let words = [
            Outcome::Sent,
            Outcome::Queued,
            Outcome::Partial,
            Outcome::Refused,
            Outcome::Failed,
            Outcome::Invalid,
        ]
        .map(Outcome::word);
        assert_eq!(
            words,
            ["sent", "queued", "partial", "refused", "failed", "invalid"]
        );
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
            result: Ok(Receipt::new("smtp://relay:587")),
            invalid: false,
        });
        assert_eq!(sent["type"], "message");
        assert_eq!(sent["file"], "a.eml");
        assert_eq!(sent["outcome"], "sent");
        assert_eq!(sent["transport"], "smtp://relay:587");
        let refused = line(&Answer {
            file: "b.eml".to_owned(),
            invalid: false,
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
    fn error(category: Category, code: &str) -> SendError {
        SendError::new(category, code, "test")
    }

    fn to(text: &str) -> lettre::Address {
        address("--to", text).unwrap()
    }

    fn sent(receipt: Receipt) -> Answer {
        Answer {
            file: "m.eml".to_owned(),
            result: Ok(receipt),
            invalid: false,
        }
    }

    #[test]
    fn a_message_delivered_to_some_recipients_names_each_other_one_with_how_it_did_not_go() {
        let receipt = Receipt::new("smtp://relay:25")
            .with_rejected_recipient(
                to("gone@example.org"),
                error(Category::Rejected, "smtp.550"),
            )
            .with_deferred_recipient(
                to("later@example.org"),
                error(Category::ServerError, "smtp.450"),
            )
            .with_maybe_delivered_recipient(
                to("lost@example.org"),
                error(Category::Timeout, "smtp.timeout"),
            );
        let answer = sent(receipt);
        assert_eq!(answer.outcome(), Outcome::Partial);
        assert_eq!(answer.code(), Exit::Down, "what may still go decides");
        let rows = failure_rows(std::slice::from_ref(&answer));
        let named: Vec<(&str, &str, &str)> = rows
            .iter()
            .map(|row| (row[1].as_str(), row[2].as_str(), row[3].as_str()))
            .collect();
        assert_eq!(
            named,
            [
                ("gone@example.org", "refused", "smtp.550"),
                ("later@example.org", "deferred", "smtp.450"),
                ("lost@example.org", "maybe delivered", "smtp.timeout"),
            ]
        );
        let json = line(&answer);
        assert_eq!(json["outcome"], "partial");
        assert_eq!(json["refused"][0]["recipient"], "gone@example.org");
        assert_eq!(json["deferred"][0]["code"], "smtp.450");
        assert_eq!(json["maybe_delivered"][0]["recipient"], "lost@example.org");
        assert_eq!(json["maybe_delivered"][0]["category"], "timeout");
    }

    #[test]
    fn a_message_every_recipient_got_or_that_was_queued_exits_0() {
        let delivered = sent(Receipt::new("smtp://relay:25"));
        assert_eq!(
            (delivered.outcome(), delivered.code()),
            (Outcome::Sent, Exit::Ok)
        );
        assert!(failure_rows(&[delivered]).is_empty());
        let queued = sent(Receipt::new("outbox").queued());
        assert_eq!(
            (queued.outcome(), queued.code()),
            (Outcome::Queued, Exit::Ok)
        );
    }

    #[test]
    fn a_message_with_only_a_refused_recipient_beside_delivered_ones_exits_3() {
        let answer = sent(Receipt::new("smtp://relay:25").with_rejected_recipient(
            to("gone@example.org"),
            error(Category::Rejected, "smtp.550"),
        ));
        assert_eq!(
            (answer.outcome(), answer.code()),
            (Outcome::Partial, Exit::Refused)
        );
    }

    #[test]
    fn a_file_that_could_not_be_read_or_parsed_is_invalid_and_exits_2() {
        let answer = Answer {
            file: "gone.eml".to_owned(),
            result: Err(error(Category::InvalidMessage, "cli.unreadable")),
            invalid: true,
        };
        assert_eq!(
            (answer.outcome(), answer.code()),
            (Outcome::Invalid, Exit::Usage)
        );
        let refused_by_the_provider = Answer {
            invalid: false,
            ..answer
        };
        assert_eq!(refused_by_the_provider.code(), Exit::Refused);
        assert_eq!(refused_by_the_provider.outcome(), Outcome::Refused);
        let down = Answer {
            file: "m.eml".to_owned(),
            result: Err(error(Category::Network, "smtp.network")),
            invalid: false,
        };
        assert_eq!((down.outcome(), down.code()), (Outcome::Failed, Exit::Down));
        let rows = failure_rows(&[down]);
        assert_eq!(rows[0][..4], ["m.eml", "all", "failed", "smtp.network"]);
    }

    #[test]
    fn a_lone_message_says_where_it_went_and_to_how_many_it_did_not() {
        let receipt = Receipt::new("smtp://relay:25").with_message_id("Q1");
        assert_eq!(where_it_went(&receipt, 0), "sent by smtp://relay:25 as Q1");
        assert_eq!(
            where_it_went(&receipt, 1),
            "sent by smtp://relay:25 as Q1, not to 1 recipient"
        );
        assert_eq!(
            where_it_went(&receipt, 2),
            "sent by smtp://relay:25 as Q1, not to 2 recipients"
        );
        let queued = Receipt::new("outbox").with_message_id("7").queued();
        assert_eq!(where_it_went(&queued, 0), "queued in the outbox as 7");
    }

    #[test]
    fn a_deferred_recipient_the_outbox_keeps_is_named_as_queued_and_exits_0() {
        let receipt = Receipt::new("smtp://relay:25").with_deferred_recipient(
            to("later@example.org"),
            error(Category::ServerError, "smtp.450"),
        );
        let kept = sent(receipt.clone().owed_kept());
        assert_eq!((kept.outcome(), kept.code()), (Outcome::Partial, Exit::Ok));
        let rows = failure_rows(std::slice::from_ref(&kept));
        assert_eq!(
            rows[0][1..4],
            ["later@example.org", "deferred, queued", "smtp.450"]
        );
        assert_eq!(line(&kept)["deferred"][0]["queued"], true);
        let not_kept = sent(receipt);
        assert_eq!(not_kept.code(), Exit::Down);
        assert_eq!(failure_rows(&[not_kept])[0][2], "deferred");
        let refused_beside = sent(
            Receipt::new("smtp://relay:25")
                .with_deferred_recipient(
                    to("later@example.org"),
                    error(Category::ServerError, "smtp.450"),
                )
                .with_rejected_recipient(
                    to("gone@example.org"),
                    error(Category::Rejected, "smtp.550"),
                )
                .owed_kept(),
        );
        assert_eq!(refused_beside.code(), Exit::Refused);
    }
    /// Review 7: recipients maybe delivered whom the outbox kept to send again exited 4, and
    /// a script resending on it made more copies.
    #[test]
    fn a_maybe_delivered_recipient_the_outbox_keeps_is_named_as_queued_and_exits_0() {
        let receipt = Receipt::new("smtp://relay:25").with_maybe_delivered_recipient(
            to("maybe@example.org"),
            error(Category::Timeout, "smtp.timeout").maybe_delivered(),
        );
        let kept = sent(receipt.clone().owed_kept());
        assert_eq!((kept.outcome(), kept.code()), (Outcome::Partial, Exit::Ok));
        let rows = failure_rows(std::slice::from_ref(&kept));
        assert_eq!(
            rows[0][1..4],
            [
                "maybe@example.org",
                "maybe delivered, queued",
                "smtp.timeout"
            ]
        );
        assert_eq!(line(&kept)["maybe_delivered"][0]["queued"], true);
        let not_kept = sent(receipt);
        assert_eq!(not_kept.code(), Exit::Down);
        assert_eq!(failure_rows(&[not_kept])[0][2], "maybe delivered");
    }
}
